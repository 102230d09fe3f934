// Package s3test starts a real S3-compatible server for tests from
// nothing: versitygw with its POSIX backend, which enforces conditional
// writes (If-Match, If-None-Match: 412).
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// Module is the versitygw version built when no binary is found.
const Module = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// Credentials of every server started here.
const (
	AccessKey = "fencegate-test"
	SecretKey = "fencegate-test-secret-key"
	Region    = "us-east-1"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns versitygw's path: $VERSITYGW_BIN, $PATH, go install's
// directory, else built with go install (about a minute).
func Binary() (string, error) {
	binOnce.Do(func() { binPath, binErr = toolbin.Find("VERSITYGW_BIN", "versitygw", Module) })
	return binPath, binErr
}

// Server is a running versitygw.
type Server struct {
	// Endpoint is its URL, e.g. http://127.0.0.1:41234.
	Endpoint string
	// Dir is the POSIX backend's directory (a bucket is a directory).
	Dir string

	proc *toolbin.Process
}

// Start starts versitygw on a free 127.0.0.1 port with a backend in a
// temporary directory, waits until it answers, and stops it when the test
// ends. The test fails (it does not skip) when it cannot be found, built
// or started.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartDir(t.TempDir())
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartDir starts versitygw with its backend in dir, for a TestMain that
// shares one server among a package's tests (Stop it after m.Run).
func StartDir(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, fmt.Errorf("versitygw is required: %w", err)
	}
	var lastErr error
	// A free port picked by binding and releasing it may be taken before
	// versitygw binds it: retry a few times.
	for range 3 {
		s, err := start(bin, dir)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("start versitygw: %w", lastErr)
}

func start(bin, dir string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	s := &Server{Endpoint: "http://" + addr, Dir: dir}
	s.proc, err = toolbin.Start(exec.Command(bin, "--access", AccessKey, "--secret", SecretKey, "--region", Region, "--port", addr, "posix", dir))
	if err != nil {
		return nil, err
	}
	if err := s.proc.WaitReady("versitygw", 20*time.Second, func() bool { return toolbin.Answers(addr, 200*time.Millisecond) }); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w:\n%s", err, s.proc.Output)
	}
	return s, nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (s *Server) Stop() { s.proc.Stop() }

// Client returns an S3 client for the server: path-style, the test
// credentials, one attempt per call.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:           Region,
		BaseEndpoint:     aws.String(s.Endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		RetryMaxAttempts: 1,
	})
}

// NewBucket creates a bucket with a fresh name and returns the name.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := "fg-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("s3test: create bucket %s: %v", name, err)
	}
	return name
}

// Get returns the object's content and metadata; ok is false when there is
// none.
func (s *Server) Get(t testing.TB, bucket, key string) (content []byte, metadata map[string]string, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := s.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		var nsk interface{ ErrorCode() string }
		if errors.As(err, &nsk) && (nsk.ErrorCode() == "NoSuchKey" || nsk.ErrorCode() == "NotFound") {
			return nil, nil, false
		}
		t.Fatalf("s3test: get s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(out.Body); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), out.Metadata, true
}

// Env returns the AWS environment for a gateway process that talks to a
// server started here: the test credentials, and no shared config or
// instance metadata.
func Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
}
