package fencelock

// Time: (b) the helpers' bounds (a server's start, a CLI run) are base
// figures scaled by the last budget the test measured (currentPatience,
// patience_test.go); ctxT takes a figure the test has scaled.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The tests run against the real service, started from the cargo-built
// binary: $FENCELOCK_BIN, else ../../target/debug/fencelock. A missing
// binary or server is a failure, never a skip.

func binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("FENCELOCK_BIN")
	if bin == "" {
		abs, err := filepath.Abs("../../target/debug/fencelock")
		if err != nil {
			t.Fatal(err)
		}
		bin = abs
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the fencelock binary is missing (%v): build it with `cargo build -p fencelock-cli --all-features` from the repository root, or set FENCELOCK_BIN", err)
	}
	return bin
}

const (
	adminToken  = "admin-token-0123456789abcdef"
	clientToken = "client-token-0123456789abcdef"
)

type service struct {
	url    string
	dbURL  string
	cmd    *exec.Cmd
	stderr *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRedis starts a throwaway redis-server and returns its URL.
func startRedis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed: %v", err)
	}
	port := freePort(t)
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pat := currentPatience()
	deadline := time.Now().Add(pat.scale(10 * time.Second))
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start on port %d [%v]", port, pat)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Sprintf("redis://127.0.0.1:%d", port)
}

// startService starts `fencelock serve` on backend "sqlite" or "redis",
// with admin and client tokens when tokens is set.
func startService(t testing.TB, backend string, tokens bool) *service {
	t.Helper()
	bin := binary(t)
	dir := t.TempDir()
	var dbURL string
	switch backend {
	case "sqlite":
		dbURL = "sqlite://" + filepath.Join(dir, "locks.db")
	case "redis":
		dbURL = startRedis(t)
	default:
		t.Fatalf("unknown backend %s", backend)
	}
	args := []string{"--url", dbURL, "serve", "--listen", "127.0.0.1:0"}
	if tokens {
		file := filepath.Join(dir, "tokens.txt")
		text := "admin " + adminToken + "\nclient " + clientToken + " gotest\n"
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--token-file", file)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "FENCELOCK_HTTP_TOKEN=", "RUST_LOG=warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &service{cmd: cmd, dbURL: dbURL, stderr: &syncBuffer{}}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("service stderr:\n%s", s.stderr.String())
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				found <- strings.TrimSpace(rest)
			}
		}
	}()
	pat := currentPatience()
	select {
	case s.url = <-found:
	case <-time.After(pat.scale(20 * time.Second)):
		t.Fatalf("fencelock serve did not say where it listens [%v]; stderr:\n%s", pat, s.stderr.String())
	}
	return s
}

func (s *service) stop(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

func (s *service) cont(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

func newClient(t testing.TB, url string, opts ...Option) *Client {
	t.Helper()
	c, err := NewClient(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// cli runs the Rust CLI and returns its exit code and stdout.
func cli(t testing.TB, env []string, args ...string) (int, string) {
	t.Helper()
	return cliWithin(t, currentPatience().scale(30*time.Second), env, args...)
}

// cliWithin is cli with the command killed after limit (a scaled figure).
func cliWithin(t testing.TB, limit time.Duration, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(append(os.Environ(), "FENCELOCK_HTTP_TOKEN=", "RUST_LOG=error"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("fencelock %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	if errb.Len() > 0 {
		t.Logf("fencelock %v stderr: %s", args, errb.String())
	}
	return code, out.String()
}

// issuedTokens takes key n times through c and returns the tokens the
// service's store issued, lowest first: a fence that shares the store
// refuses tokens it never issued.
func issuedTokens(t testing.TB, ctx context.Context, c *Client, key string, n int) []uint64 {
	t.Helper()
	tokens := make([]uint64, 0, n)
	for i := 0; i < n; i++ {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		tokens = append(tokens, l.Token())
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %s: %v", key, err)
		}
	}
	return tokens
}

// eventStreams counts the event streams c has opened (GET /v1/events whose
// head came back). A waiter opens its key's stream once it found the key
// held, and tries once more after the head: a release after the count rose
// reaches the waiter through the stream. A test waits for that count
// instead of sleeping and hoping the waiter is there by then. Call it
// before c sends anything.
func eventStreams(c *Client) func() int {
	counter := &streamCounter{next: c.http.Transport}
	if counter.next == nil {
		counter.next = http.DefaultTransport
	}
	c.http.Transport = counter
	return func() int { return int(counter.opened.Load()) }
}

type streamCounter struct {
	next   http.RoundTripper
	opened atomic.Int64
}

func (s *streamCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusOK && strings.HasSuffix(req.URL.Path, "/v1/events") {
		s.opened.Add(1)
	}
	return resp, err
}

// CloseIdleConnections is the wrapped transport's, which Client.Close calls.
func (s *streamCounter) CloseIdleConnections() {
	if c, ok := s.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// ctxT is a context ended after d (a scaled figure) or with the test.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
