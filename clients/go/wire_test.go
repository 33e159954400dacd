package fencelock

// Time: (b) the contexts and bounds are base figures scaled by the test's
// measured patience (patience_test.go). The deadlines a test sets to see
// them honoured (200 ms) stay as they are; the bound on a cancelled
// request is scaled, and the request timeout it tells apart from is set
// far beyond it.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The client's own keep-alive path (wire.go), against the service through
// a TCP proxy that can drop its connections or take a request without
// passing it on.

// faultProxy forwards connections to the service. next("close") makes it
// take the next request it reads and close that connection without an
// answer; next("stall") makes it take the next request and never answer.
type faultProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]net.Conn // client side → service side
	accepted int
	mode     string
	taken    int
	stalled  chan struct{} // closed when the stalled connection is closed by the client
}

func newFaultProxy(t *testing.T, serviceURL string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: strings.TrimPrefix(serviceURL, "http://"), conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.dropAll()
		p.wg.Wait()
	})
	return p
}

func (p *faultProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		sc, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = cc.Close()
			continue
		}
		p.mu.Lock()
		p.conns[cc] = sc
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(cc, sc)
			_ = cc.Close()
		}()
		go p.forward(cc, sc)
	}
}

// forward passes the client's bytes on, but for a request the mode takes.
func (p *faultProxy) forward(cc, sc net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, cc)
		p.mu.Unlock()
		_ = cc.Close()
		_ = sc.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := cc.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		mode := p.mode
		if mode != "" {
			p.mode = ""
			p.taken++
		}
		stalled := p.stalled
		p.mu.Unlock()
		switch mode {
		case "close":
			return
		case "stall":
			// Read on until the client gives up and closes.
			_, _ = io.Copy(io.Discard, cc)
			close(stalled)
			return
		}
		if _, err := sc.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *faultProxy) next(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	if mode == "stall" {
		p.stalled = make(chan struct{})
	}
}

// dropAll closes every connection as a restarting service would.
func (p *faultProxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for cc, sc := range p.conns {
		_ = cc.Close()
		_ = sc.Close()
	}
}

func (p *faultProxy) counts() (accepted, taken int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, p.taken
}

func (w *wire) idleCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.idle)
}

// overProxy starts a service over SQLite behind a fault proxy and a
// client (with opts) that reaches it through the proxy, with a context of
// 30 s scaled by pat.
func overProxy(t *testing.T, pat patience, opts ...Option) (*service, *faultProxy, *Client, context.Context) {
	t.Helper()
	s := startService(t, "sqlite", false)
	p := newFaultProxy(t, s.url)
	return s, p, newClient(t, p.url(), opts...), ctxT(t, pat.scale(30*time.Second))
}

// The pooled path serves plain http:// with the client's own transport
// only; a caller's *http.Client, https and a token net/http would refuse
// keep net/http.
func TestWireOnlyWithoutACallersClient(t *testing.T) {
	cases := []struct {
		url  string
		opts []Option
		wire bool
	}{
		{"http://127.0.0.1:7878", nil, true},
		{"http://127.0.0.1:7878/prefix", []Option{WithToken("t0ken")}, true},
		{"http://127.0.0.1:7878", []Option{WithHTTPClient(&http.Client{})}, false},
		{"https://127.0.0.1:7878", nil, false},
		{"http://127.0.0.1:7878", []Option{WithToken("bad\ntoken")}, false},
	}
	for _, tc := range cases {
		c, err := NewClient(tc.url, tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.wire != nil; got != tc.wire {
			t.Errorf("%s with %d options: own path %v, want %v", tc.url, len(tc.opts), got, tc.wire)
		}
		_ = c.Close()
	}
}

// Cycles go over one connection, kept alive between requests.
func TestWireReusesOneConnection(t *testing.T) {
	_, p, c, ctx := overProxy(t, measurePatience())
	for i := 0; i < 20; i++ {
		l, err := c.TryAcquire(ctx, "wire/reuse")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if accepted, _ := p.counts(); accepted != 1 {
		t.Fatalf("20 cycles opened %d connections, want 1", accepted)
	}
	if n := c.wire.idleCount(); n != 1 {
		t.Fatalf("%d idle connections after the cycles, want 1", n)
	}
}

// A connection the service closed while it was idle is found closed
// before a request is sent on it: the release goes over a new connection
// and is done on the service.
func TestWireRedialsAfterTheServiceDroppedAConnection(t *testing.T) {
	pat := measurePatience()
	s, p, c, ctx := overProxy(t, pat)
	l, err := c.TryAcquire(ctx, "wire/dropped")
	if err != nil {
		t.Fatal(err)
	}
	p.dropAll()
	// The precondition of the case: the close has reached the client's
	// socket (on loopback at once; waited for, not assumed).
	c.wire.mu.Lock()
	alive := c.wire.idle[0].alive
	c.wire.mu.Unlock()
	for alive() == nil {
		if ctx.Err() != nil {
			t.Fatalf("the dropped connection never read as closed [%v]", pat)
		}
		runtime.Gosched()
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release after the connection was dropped: %v", err)
	}
	if accepted, _ := p.counts(); accepted != 2 {
		t.Fatalf("%d connections, want 2 (the dropped one and its replacement)", accepted)
	}
	if _, err := newClient(t, s.url).Inspect(ctx, "wire/dropped"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the release did not reach the service: %v", err)
	}
}

// A request whose connection closes before any answer: an acquire (a
// POST) is not sent again, since the service may have granted it; the
// caller gets ErrUnavailable. A GET is sent again over a new connection.
func TestWireNeverResendsAPost(t *testing.T) {
	_, p, c, ctx := overProxy(t, measurePatience())
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	p.next("close")
	_, err := c.TryAcquire(ctx, "wire/post")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire over a connection closed unanswered: %v, want ErrUnavailable", err)
	}
	if accepted, taken := p.counts(); accepted != 1 || taken != 1 {
		t.Fatalf("%d connections and %d requests taken: the acquire was sent again", accepted, taken)
	}
	// A new connection, kept alive, for the GET to find closed.
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	p.next("close")
	if _, err := c.Inspect(ctx, "wire/post"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("inspect sent again: %v, want the service's not_found", err)
	}
	if accepted, taken := p.counts(); accepted != 3 || taken != 2 {
		t.Fatalf("%d connections and %d requests taken, want 3 and 2", accepted, taken)
	}
	l, err := c.TryAcquire(ctx, "wire/post")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A context cancelled while the service has not answered ends the request
// at once with the context's error, closes the connection, and leaves no
// goroutine; a context's deadline and the client's timeout likewise, as
// ErrUnavailable matching context.DeadlineExceeded.
func TestWireCancelMidRequest(t *testing.T) {
	pat := measurePatience()
	// A cancelled request ends within bound; the request timeout, which
	// would end it otherwise, is four times as long.
	bound := pat.scale(5 * time.Second)
	_, p, c, ctx := overProxy(t, pat, WithTimeout(4*bound))
	short := newClient(t, p.url(), WithTimeout(200*time.Millisecond))
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()

	p.next("stall")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.TryAcquire(cctx, "wire/cancel")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled acquire: %v, want context.Canceled", err)
	}
	// Far under the request timeout, which would end it otherwise.
	if took := time.Since(start); took > bound {
		t.Fatalf("cancelled acquire returned after %v, more than %v [%v]", took, bound, pat)
	}
	select {
	case <-p.stalled:
	case <-ctx.Done():
		t.Fatalf("the client kept the stalled connection open [%v]", pat)
	}

	p.next("stall")
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer dcancel()
	if _, err := c.TryAcquire(dctx, "wire/cancel"); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire past its deadline: %v, want context.DeadlineExceeded and ErrUnavailable", err)
	}
	select {
	case <-p.stalled:
	case <-ctx.Done():
		t.Fatalf("the client kept the stalled connection open [%v]", pat)
	}
	p.next("stall")
	if _, err := short.TryAcquire(context.Background(), "wire/cancel"); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire past the client's timeout: %v, want context.DeadlineExceeded and ErrUnavailable", err)
	}
	select {
	case <-p.stalled:
	case <-ctx.Done():
		t.Fatalf("the client kept the stalled connection open [%v]", pat)
	}
	if n := c.wire.idleCount() + short.wire.idleCount(); n != 0 {
		t.Fatalf("%d idle connections after three ended requests, want 0", n)
	}
	deadline := time.Now().Add(pat.scale(3 * time.Second))
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after [%v]:\n%s", before, runtime.NumGoroutine(), pat, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatalf("after the ended requests: %v", err)
	}
}

// countingServer starts an httptest server with handler, closed when the
// test ends, and a count of the connections it has accepted.
func countingServer(t *testing.T, handler http.Handler) (*httptest.Server, func() int) {
	t.Helper()
	var mu sync.Mutex
	opened := 0
	srv := httptest.NewUnstartedServer(handler)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, func() int {
		mu.Lock()
		defer mu.Unlock()
		return opened
	}
}

// An answer with Connection: close is read, and its connection is not
// kept: the next request dials anew.
func TestWireConnectionClose(t *testing.T) {
	srv, opened := countingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"key":"k","owner":"o","token":7,"ttl_ms":30000,"expires_in_ms":30000}`)
	}))
	c := newClient(t, srv.URL)
	ctx := ctxT(t, measurePatience().scale(10*time.Second))
	for i := 0; i < 3; i++ {
		info, err := c.Inspect(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if info.Token != 7 {
			t.Fatalf("inspect read %+v", info)
		}
		if n := c.wire.idleCount(); n != 0 {
			t.Fatalf("a Connection: close answer left %d idle connections", n)
		}
	}
	if n := opened(); n != 3 {
		t.Fatalf("3 requests answered with Connection: close opened %d connections, want 3", n)
	}
}

// An informational answer (103 Early Hints here) before the answer is
// skipped, and the connection is kept.
func TestWireSkipsInformationalAnswers(t *testing.T) {
	srv, opened := countingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</v1/stats>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"key":"k","owner":"o","token":9,"ttl_ms":30000,"expires_in_ms":30000}`)
	}))
	c := newClient(t, srv.URL)
	ctx := ctxT(t, measurePatience().scale(10*time.Second))
	for i := 0; i < 3; i++ {
		info, err := c.Inspect(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if info.Token != 9 {
			t.Fatalf("inspect read %+v", info)
		}
	}
	if n := opened(); n != 1 {
		t.Fatalf("3 requests opened %d connections, want 1", n)
	}
}
