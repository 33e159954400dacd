// Package fencelock is the Go client of the fencelock lock service
// (`fencelock serve`, docs/http.md): locks with fencing tokens, renewed in
// the background by one goroutine per Client, whose loss cancels a
// context.Context the moment the lease can no longer be trusted.
//
// A lease is trusted only until t_sent + ttl·(1−drift) − min(ttl/10, 500 ms)
// (drift 1 %), where t_sent is read on the monotonic clock before the
// acquire or renew request is sent (invariant I5 of docs/semantics.md).
// Renewals go every ttl/3; transient failures are retried with jittered
// backoff while the lease is trusted; a refused renewal or a passed
// deadline is a loss.
//
// Present Lock.Token to every protected resource: admit it at a fence
// (Client.Fence) before reading what you will modify, or write the
// service's fenced store (Client.KVPut).
package fencelock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// TokenEnv is the environment variable NewClient reads for the bearer
// token when no WithToken option is given.
const TokenEnv = "FENCELOCK_HTTP_TOKEN"

// DefaultTTL is the lease length when no TTL option is given.
const DefaultTTL = 30 * time.Second

// DefaultTimeout bounds one request (the Rust client's operation timeout).
const DefaultTimeout = 10 * time.Second

// Drift and MaxMargin are the defaults of the library's clock policy
// (crates/fencelock-core/src/client.rs, ClockPolicy).
const (
	Drift     = 0.01
	MaxMargin = 500 * time.Millisecond
)

// ValidFor is how long after t_sent a lease of ttl is trusted:
// ttl·(1−Drift) − min(ttl/10, MaxMargin). A 30 s lease is trusted 29.2 s.
func ValidFor(ttl time.Duration) time.Duration {
	margin := ttl / 10
	if margin > MaxMargin {
		margin = MaxMargin
	}
	d := time.Duration(float64(ttl)*(1-Drift)) - margin
	if d < 0 {
		return 0
	}
	return d
}

// Client talks to one lock service. It is safe for concurrent use; make one
// per process and Close it when done (Close releases the locks it holds).
type Client struct {
	base     *url.URL
	token    string
	http     *http.Client
	ownsHTTP bool
	wire     *wire // short requests when http is ours and the URL http://
	timeout  time.Duration

	renewer *renewer
	bg      sync.WaitGroup // background requests (releases after loss)

	mu     sync.Mutex
	closed bool
	held   map[*Lock]struct{}
}

// Option configures a Client.
type Option func(*Client) error

// WithToken sets the bearer token (default: $FENCELOCK_HTTP_TOKEN).
func WithToken(token string) Option {
	return func(c *Client) error { c.token = token; return nil }
}

// WithHTTPClient sets the *http.Client used for every request: TLS (a
// private CA, client certificates) and proxies are configured there. Its
// Timeout should be zero or longer than WithTimeout: the wake-up event
// streams of waiting acquisitions last as long as the wait. Without it, the
// requests to an http:// service but the event streams go over the
// client's own keep-alive connections (docs/go.md#connections).
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) error {
		if h == nil {
			return invalid("connect", "", "nil *http.Client")
		}
		c.http, c.ownsHTTP = h, false
		return nil
	}
}

// WithTimeout bounds each request (default 10 s); a renewal is bounded
// tighter, by a third of the lease.
func WithTimeout(d time.Duration) Option {
	return func(c *Client) error {
		if d <= 0 {
			return invalid("connect", "", fmt.Sprintf("timeout %v must be positive", d))
		}
		c.timeout = d
		return nil
	}
}

// NewClient makes a client of the service at baseURL
// ("http://127.0.0.1:7878", "https://locks.internal:7878/prefix"). It
// sends nothing; the first request finds out whether the service answers.
func NewClient(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		// url.Error quotes the URL whole, password included: say only why.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, &Error{Op: "connect", Code: "bad_request", Message: "bad base URL: " + err.Error(), Err: err}
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		u.User = nil
		return nil, invalid("connect", "", fmt.Sprintf("bad base URL %s: want http[s]://host[:port][/prefix]", shorten(u.Redacted())))
	}
	c := &Client{
		base:     &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimSuffix(u.Path, "/")},
		token:    os.Getenv(TokenEnv),
		http:     &http.Client{Transport: transport()},
		ownsHTTP: true,
		timeout:  DefaultTimeout,
		held:     make(map[*Lock]struct{}),
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			c.token = p
		}
	}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.ownsHTTP {
		c.wire = newWire(c.base, c.token)
	}
	c.renewer = newRenewer(c)
	return c, nil
}

// transport is http.DefaultTransport with more idle connections to the
// one host: renewals of many locks come in bursts, and two idle
// connections (the default) would make most of them dial anew.
func transport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// Close stops the renewer, releases every lock the client holds (their
// contexts are cancelled with a LostError of reason "closed"), waits for
// background requests and closes idle connections. Later calls fail with
// ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	locks := make([]*Lock, 0, len(c.held))
	for l := range c.held {
		locks = append(locks, l)
	}
	c.mu.Unlock()
	c.renewer.stop()
	var wg sync.WaitGroup
	for _, l := range locks {
		if l.finish(&LostError{Key: l.key, Token: l.token, Reason: "closed"}) {
			wg.Add(1)
			go func(l *Lock) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
				defer cancel()
				_ = c.release(ctx, l.key, l.owner, l.token, l.mode)
			}(l)
		}
	}
	wg.Wait()
	c.bg.Wait()
	if c.ownsHTTP {
		c.http.CloseIdleConnections()
	}
	if c.wire != nil {
		c.wire.close()
	}
	return nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// path joins escaped segments under the base URL (a key may contain '/').
func (c *Client) path(segments ...string) string {
	var b strings.Builder
	b.WriteString(c.base.String())
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

type errorBody struct {
	Error   string    `json:"error"`
	Code    string    `json:"code"`
	Holder  *LockInfo `json:"holder"`
	Current *uint64   `json:"current"`
}

// do sends one request bounded by timeout (and ctx) and decodes a 200 into
// out; anything else is an *Error.
func (c *Client) do(ctx context.Context, op, key, method, u string, body, out any, timeout time.Duration) error {
	if c.isClosed() {
		return &Error{Op: op, Key: key, Message: "client closed", Err: ErrClosed}
	}
	return c.send(ctx, op, key, method, u, body, out, timeout)
}

// send is do without the closed check: releases still go out during and
// after Close.
func (c *Client) send(ctx context.Context, op, key, method, u string, body, out any, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = c.timeout
	}
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return &Error{Op: op, Key: key, Code: "bad_request", Message: err.Error(), Err: err}
		}
	}
	var (
		a        answer
		answered bool
		err      error
	)
	if uri, ok := c.wire.requestURI(u); ok {
		a, answered, err = c.wire.roundTrip(ctx, timeout, method, uri, payload)
	} else {
		a, answered, err = c.roundTripHTTP(ctx, timeout, method, u, payload)
	}
	if err != nil {
		var bad *badRequest
		switch {
		case errors.As(err, &bad):
			return &Error{Op: op, Key: key, Code: "bad_request", Message: bad.err.Error(), Err: bad.err}
		case answered:
			return &Error{Op: op, Key: key, Message: "the lock service's answer was cut: " + err.Error(), Err: err}
		default:
			return &Error{Op: op, Key: key, Message: "the lock service did not answer: " + err.Error(), Err: err}
		}
	}
	data := a.body
	if a.status == http.StatusOK {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			// A 200 that does not parse was cut or garbled: the outcome
			// is unknown, never a success.
			return &Error{Op: op, Key: key, Status: 0, Message: "unreadable answer: " + err.Error(), Err: err}
		}
		return nil
	}
	var refusal errorBody
	if json.Unmarshal(data, &refusal) != nil || refusal.Code == "" {
		msg := strings.TrimSpace(string(data))
		if len(msg) > 200 {
			msg = msg[:200]
		}
		refusal = errorBody{Error: msg}
	}
	return &Error{Op: op, Key: key, Status: a.status, Code: refusal.Code,
		Message: refusal.Error, Holder: refusal.Holder, Current: refusal.Current}
}

// badRequest is a request net/http refused to build.
type badRequest struct{ err error }

func (b *badRequest) Error() string { return b.err.Error() }

// roundTripHTTP is roundTrip over the client's *http.Client.
func (c *Client) roundTripHTTP(ctx context.Context, timeout time.Duration, method, u string, payload []byte) (a answer, answered bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var reader io.Reader
	if payload != nil {
		reader = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, reader)
	if err != nil {
		return a, false, &badRequest{err}
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return a, false, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return a, true, err
	}
	return answer{status: resp.StatusCode, body: data}, true, nil
}
