// Command vulnerable is vulncheck's self-test (scripts/tools.sh): it calls
// a symbol with a known vulnerability (golang.org/x/text v0.3.5,
// language.Parse: GO-2021-0113), which govulncheck must report. It is a
// module of its own under testdata, never built with fencegate.
package main

import (
	"fmt"

	"golang.org/x/text/language"
)

func main() { fmt.Println(language.Parse("en")) }
