package webhook

import (
	"net"
	"net/http"
)

// WrapConns makes a wrap every connection it dials (under its byte count),
// to fail a connection's writes on purpose.
func WrapConns(a *Adapter, wrap func(net.Conn) net.Conn) { a.wrapConn = wrap }

// SendWrite sends hr, a request built by the test, the way Execute sends
// a request with a body (kept-alive connections) and classifies the
// outcome as Execute does: the status, or the adapters error.
func SendWrite(a *Adapter, hr *http.Request) (int, error) {
	_, status, _, err := a.do(a.client, hr, true, nil)
	return status, err
}
