//go:build tools

// Package tools pins what the lab runs of OLM, as OpenShift's OperatorHub runs it: the OLM
// operator, the catalog operator and opm, which serves a file-based catalog. scripts/build-olm.sh
// builds the three commands from this module's requirements.
package tools

import (
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/olm"
	_ "github.com/operator-framework/operator-registry/cmd/opm"
)
