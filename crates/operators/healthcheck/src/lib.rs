//! Node Health Check: decides which nodes are unhealthy and drives remediation through templates.
