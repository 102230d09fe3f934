// Package docs carries the HTTP API's OpenAPI 3.1 description,
// docs/openapi.yaml, into the binary: the admin server serves it as JSON
// at GET /api/v1/openapi.json, and its tests hold the running server to
// it. The YAML file is the one source; the JSON is made from it.
package docs

import (
	_ "embed"
	"sync"

	"sigs.k8s.io/yaml"
)

// OpenAPIYAML is docs/openapi.yaml as written.
//
//go:embed openapi.yaml
var OpenAPIYAML []byte

var openAPIJSON = sync.OnceValues(func() ([]byte, error) { return yaml.YAMLToJSON(OpenAPIYAML) })

// OpenAPIJSON returns the description as JSON (converted once). The
// caller must not change the slice.
func OpenAPIJSON() ([]byte, error) { return openAPIJSON() }
