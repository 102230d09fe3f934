// Package httpserver makes every HTTP server the gateway runs (the admin
// API and pages, the metrics and probes, gateway dev's echo receiver) with
// all four timeouts set, so that no client can hold a connection or a
// goroutine open by sending or reading slowly.
package httpserver

import (
	"log/slog"
	"net/http"
	"time"
)

// The timeouts of every server.
const (
	// ReadHeaderTimeout bounds reading a request's headers (slowloris).
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout = time.Minute
	// WriteTimeout bounds writing a response, from the end of the
	// request's headers.
	WriteTimeout = 2 * time.Minute
	// IdleTimeout closes a kept-alive connection idle this long.
	IdleTimeout = 2 * time.Minute
)

// New returns a server for h with every timeout set; log (nil: the
// standard logger) receives the server's own errors at warn.
func New(h http.Handler, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
	}
	if log != nil {
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	return srv
}
