//! Node Maintenance: cordons and drains a node on request, and gives it back.
