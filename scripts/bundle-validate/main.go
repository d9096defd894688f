// bundle-validate checks an OLM bundle directory with the Operator Framework's own validators:
// the default bundle validators (what `operator-sdk bundle validate` runs) and OperatorHub's,
// good practices and deprecated APIs for the Kubernetes version given. It prints every finding
// and exits 1 when any is an error.
package main

import (
	"fmt"
	"os"

	apimanifests "github.com/operator-framework/api/pkg/manifests"
	apivalidation "github.com/operator-framework/api/pkg/validation"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: bundle-validate <bundle directory> <kubernetes version, e.g. 1.36>")
		os.Exit(2)
	}
	bundle, err := apimanifests.GetBundleFromDir(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "reading the bundle in %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	validators := apivalidation.DefaultBundleValidators.WithValidators(
		apivalidation.OperatorHubV2Validator,
		apivalidation.StandardCapabilitiesValidator,
		apivalidation.StandardCategoriesValidator,
		apivalidation.GoodPracticesValidator,
		apivalidation.AlphaDeprecatedAPIsValidator,
	)
	objects := append(bundle.ObjectsToValidate(), map[string]string{"k8s-version": os.Args[2]})
	errors, warnings := 0, 0
	for _, result := range validators.Validate(objects...) {
		for _, e := range result.Errors {
			errors++
			fmt.Printf("error: %s: %s\n", result.Name, e.Error())
		}
		for _, w := range result.Warnings {
			warnings++
			fmt.Printf("warning: %s: %s\n", result.Name, w.Error())
		}
	}
	fmt.Printf("%s: %d errors, %d warnings\n", bundle.Name, errors, warnings)
	if errors > 0 {
		os.Exit(1)
	}
}
