package fencelock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxAnswer bounds the body of one answer the client reads.
const maxAnswer = 64 << 20

// maxIdleConns is how many idle connections a client keeps to its service:
// renewals of many locks come in bursts, and a pool of two would make most
// of them dial anew.
const maxIdleConns = 64

// wire is the client's own HTTP/1.1 path for short requests to an http://
// service when the caller did not bring an *http.Client: a pool of
// keep-alive connections, each request written and its answer read in the
// caller's goroutine. net/http's Transport hands every request to the
// connection's writer goroutine and the answer back from its reader
// goroutine; those two hand-offs cost more than the rest of a request to a
// local service (docs/go.md#performance). Event streams, https:// and a
// caller's *http.Client keep using net/http.
//
// Nothing runs in the background: an idle connection is only a socket in
// the pool, checked for a close by the service before it is used again
// (newAliveCheck); the request's timeout is the socket's deadline, and a
// context that ends mid-request ends it by moving that deadline to the
// past (context.AfterFunc, which starts no goroutine unless the context
// ends).
type wire struct {
	addr   string // host:port to dial
	origin string // scheme://host, cut from the request URLs
	head   string // the request headers after the request line, but the body's
	dialer net.Dialer

	mu     sync.Mutex
	idle   []*wireConn
	closed bool
}

type wireConn struct {
	nc    net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	alive func() error // newAliveCheck
}

// newWire returns the pooled path for base, or nil where net/http must
// carry the requests: https, a proxy from the environment, a host or token
// that needs net/http's encoding or validation, a platform without
// newAliveCheck.
func newWire(base *url.URL, token string) *wire {
	if base.Scheme != "http" || !canCheckAlive || !isASCII(base.Host) || !validHeaderValue(token) {
		return nil
	}
	if p, err := http.ProxyFromEnvironment(&http.Request{URL: base}); err != nil || p != nil {
		return nil
	}
	port := base.Port()
	if port == "" {
		port = "80"
	}
	var h strings.Builder
	// What net/http sends for these requests, but Accept-Encoding: its
	// transparent gzip is of no use for answers of a few hundred bytes.
	h.WriteString(" HTTP/1.1\r\nHost: ")
	h.WriteString(strings.TrimSuffix(base.Host, ":"))
	h.WriteString("\r\nUser-Agent: Go-http-client/1.1\r\n")
	if token != "" {
		h.WriteString("Authorization: Bearer ")
		h.WriteString(token)
		h.WriteString("\r\n")
	}
	return &wire{
		addr:   net.JoinHostPort(base.Hostname(), port),
		origin: base.Scheme + "://" + base.Host,
		head:   h.String(),
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// validHeaderValue is net/http's rule for a header value: no control
// characters but tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

// requestURI is u's path and query when w carries requests to u (a nil w
// carries none).
func (w *wire) requestURI(u string) (string, bool) {
	if w == nil {
		return "", false
	}
	uri, ok := strings.CutPrefix(u, w.origin)
	return uri, ok && strings.HasPrefix(uri, "/")
}

// answer is what came back for one request.
type answer struct {
	status int
	body   []byte
}

// roundTrip sends one request with an optional JSON body and reads the
// whole answer, within timeout and while ctx lasts. A failure before the
// answer's status line is reported with answered false (the service did
// not answer), after it with answered true (the answer was cut). The error
// matches ctx.Err() when ctx ended the request, and
// context.DeadlineExceeded when the timeout did, as net/http's do under
// context.WithTimeout.
//
// Retries: a GET that found its reused connection closed by the service
// (no byte of an answer read) goes once more over a new connection, as
// net/http retries an idempotent request. A POST, PUT or DELETE never does:
// once its bytes have left, the service may have acted on it (an acquire
// granted, a release done), and sending it again could take a second grant
// or report a refusal for a success; the caller gets the unknown outcome
// as an error of ErrUnavailable, as with net/http. The check of an idle
// connection before it is reused (newAliveCheck) keeps that case to a
// service closing the connection in the instant the request was sent.
func (w *wire) roundTrip(ctx context.Context, timeout time.Duration, method, uri string, body []byte) (a answer, answered bool, err error) {
	// The socket's deadline bounds the request; no context or timer is
	// made for it.
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for attempt := 0; ; attempt++ {
		wc, reused, err := w.get(ctx, deadline)
		if err != nil {
			return a, false, w.urlError(ctx, method, uri, err)
		}
		a, answered, err = w.exchange(ctx, wc, method, uri, body)
		if err == nil {
			return a, true, nil
		}
		if !answered && reused && method == "GET" && attempt == 0 && ctx.Err() == nil && time.Now().Before(deadline) {
			continue
		}
		return a, answered, w.urlError(ctx, method, uri, err)
	}
}

// exchange is one request and its answer over wc, which it puts back in
// the pool when the answer was read whole and the connection may be kept,
// and closes otherwise.
func (w *wire) exchange(ctx context.Context, wc *wireConn, method, uri string, body []byte) (a answer, answered bool, err error) {
	keep := false
	if ctx.Done() != nil {
		// Only a context that ends mid-request touches the socket: its
		// deadline set in the past wakes the read or write below. The
		// connection is then closed, never reused with that deadline.
		// context.AfterFunc starts no goroutine unless ctx ends.
		stop := context.AfterFunc(ctx, func() { _ = wc.nc.SetDeadline(time.Unix(1, 0)) })
		defer func() {
			if !stop() {
				keep = false
			}
			w.putOrClose(wc, keep)
		}()
	} else {
		defer func() { w.putOrClose(wc, keep) }()
	}
	bw := wc.bw
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(w.head)
	if body != nil {
		bw.WriteString("Content-Type: application/json\r\nContent-Length: ")
		bw.WriteString(strconv.Itoa(len(body)))
		bw.WriteString("\r\n\r\n")
		bw.Write(body)
	} else {
		bw.WriteString("\r\n")
	}
	if err := bw.Flush(); err != nil {
		return a, false, err
	}
	if _, err := wc.br.Peek(1); err != nil {
		return a, false, err
	}
	resp, err := http.ReadResponse(wc.br, nil)
	// Informational answers come before the answer (net/http skips them
	// too); the service sends none, as no request asks for one.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(wc.br, nil)
	}
	if err != nil {
		return a, true, err
	}
	var data []byte
	if n := resp.ContentLength; n >= 0 && n < maxAnswer {
		data = make([]byte, n)
		_, err = io.ReadFull(resp.Body, data)
	} else {
		data, err = io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	}
	resp.Body.Close()
	if err != nil {
		return a, true, err
	}
	// An answer at the limit may have more to it: the connection is not
	// at the start of the next answer.
	keep = !resp.Close && len(data) < maxAnswer && resp.StatusCode >= 200
	return answer{status: resp.StatusCode, body: data}, true, nil
}

// urlError wraps a transport failure as net/http does (*url.Error): with
// the context's error when the context ended the request (a deadline the
// AfterFunc set shows as an I/O timeout otherwise), and
// context.DeadlineExceeded when the request's deadline passed.
func (w *wire) urlError(ctx context.Context, method, uri string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		err = cerr
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		err = context.DeadlineExceeded
	}
	op := method[:1] + strings.ToLower(method[1:])
	return &url.Error{Op: op, URL: w.origin + uri, Err: err}
}

// get takes an idle connection that is still open, or dials one, with
// its deadline set.
func (w *wire) get(ctx context.Context, deadline time.Time) (wc *wireConn, reused bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	for {
		w.mu.Lock()
		n := len(w.idle)
		if n == 0 {
			w.mu.Unlock()
			break
		}
		wc = w.idle[n-1]
		w.idle[n-1] = nil
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		// The service may have closed it while it was idle (a restart,
		// an idle timeout); an answer it sent unasked makes it unusable
		// too. Either way the request has not left yet. The deadline
		// goes first: the previous request's may have passed, and the
		// check reads nothing past a deadline.
		if wc.br.Buffered() == 0 && wc.nc.SetDeadline(deadline) == nil && wc.alive() == nil {
			return wc, true, nil
		}
		_ = wc.nc.Close()
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	nc, err := w.dialer.DialContext(dctx, "tcp", w.addr)
	if err != nil {
		return nil, false, err
	}
	if err := nc.SetDeadline(deadline); err != nil {
		_ = nc.Close()
		return nil, false, err
	}
	return &wireConn{nc: nc, br: bufio.NewReaderSize(nc, 4096), bw: bufio.NewWriterSize(nc, 4096), alive: newAliveCheck(nc)}, false, nil
}

// putOrClose puts wc back in the pool if keep, else closes it.
func (w *wire) putOrClose(wc *wireConn, keep bool) {
	w.mu.Lock()
	if !keep || w.closed || len(w.idle) >= maxIdleConns {
		w.mu.Unlock()
		_ = wc.nc.Close()
		return
	}
	w.idle = append(w.idle, wc)
	w.mu.Unlock()
}

// close closes the idle connections and every connection handed back
// later; requests still dial (the releases Close sends).
func (w *wire) close() {
	w.mu.Lock()
	idle := w.idle
	w.idle, w.closed = nil, true
	w.mu.Unlock()
	for _, wc := range idle {
		_ = wc.nc.Close()
	}
}

// errUnasked is an idle connection on which the service sent something.
var errUnasked = errors.New("fencelock: unexpected bytes on an idle connection")
