package s3

import (
	"net/http"
	"testing"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/fencegate/fencegate/adapters"
)

// A failed read's 4xx is permanent (it ends an Execute failed and holds a
// Lookup's intent for an operator) unless it passes with time: expired
// credentials, a clock the server finds off, a timed-out request.
func TestReadErrorsClassified(t *testing.T) {
	t.Parallel()
	read := func(code string, status int) error {
		return retryOrFail("s3: head", &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      &smithy.GenericAPIError{Code: code, Message: code},
		})
	}
	for _, c := range []struct {
		code      string
		status    int
		permanent bool
	}{
		{"AccessDenied", 403, true},
		{"NoSuchBucket", 404, true},
		{"ExpiredToken", 400, false},
		{"RequestTimeTooSkewed", 403, false},
		{"RequestTimeout", 400, false},
		{"SlowDown", 503, false},
		{"InternalError", 500, false},
	} {
		err := read(c.code, c.status)
		if adapters.IsPermanent(err) != c.permanent {
			t.Errorf("%s (%d): %v, permanent %v, want %v", c.code, c.status, err, adapters.IsPermanent(err), c.permanent)
		}
	}
}
