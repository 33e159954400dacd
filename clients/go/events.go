package fencelock

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Event is one event of the service's stream (GET /v1/events).
type Event struct {
	// Type is "acquired", "released", "expired", "lost" (force-released),
	// "fenced_out" (a fence refused a token; Key is the resource) or
	// "resync" (the follower fell behind: reload the list).
	Type  string `json:"type"`
	Key   string `json:"key"`
	Owner string `json:"owner,omitempty"`
	Token uint64 `json:"token"`
	// Lock is the whole lease, with "acquired", when the service found it.
	Lock *LockInfo `json:"lock,omitempty"`
	// Current is the highest admitted token, with "fenced_out".
	Current *uint64   `json:"current,omitempty"`
	At      time.Time `json:"at"`
}

// EventFilter selects the events of one key, or of the keys with a prefix
// (both empty: every event).
type EventFilter struct {
	Key    string
	Prefix string
}

// Events follows the service's event stream. Once it returns, every later
// event is delivered (the service subscribes before answering). The
// channel is closed when ctx is done or the stream ends; a slow reader
// holds the stream back.
func (c *Client) Events(ctx context.Context, filter EventFilter) (<-chan Event, error) {
	body, err := c.openEvents(ctx, filter)
	if err != nil {
		return nil, err
	}
	out := make(chan Event, 16)
	go func() {
		defer close(out)
		defer body.Close()
		readEvents(body, func(e Event) bool {
			select {
			case out <- e:
				return true
			case <-ctx.Done():
				return false
			}
		})
	}()
	return out, nil
}

// openEvents sends GET /v1/events and waits for the head (bounded by the
// client's timeout); the body lasts until ctx is done.
func (c *Client) openEvents(ctx context.Context, filter EventFilter) (io.ReadCloser, error) {
	if c.isClosed() {
		return nil, &Error{Op: "events", Key: filter.Key, Message: "client closed", Err: ErrClosed}
	}
	q := url.Values{}
	if filter.Key != "" {
		q.Set("key", filter.Key)
	}
	if filter.Prefix != "" {
		q.Set("prefix", filter.Prefix)
	}
	u := c.path("v1", "events")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	hctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(hctx, "GET", u, nil)
	if err != nil {
		cancel()
		return nil, &Error{Op: "events", Key: filter.Key, Code: "bad_request", Message: err.Error(), Err: err}
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	headTimer := time.AfterFunc(c.timeout, cancel)
	resp, err := c.http.Do(req)
	if !headTimer.Stop() || err != nil {
		cancel()
		if err == nil {
			resp.Body.Close()
			err = context.DeadlineExceeded
		}
		return nil, &Error{Op: "events", Key: filter.Key, Message: "the lock service did not answer: " + err.Error(), Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		var refusal errorBody
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = json.Unmarshal(data, &refusal)
		return nil, &Error{Op: "events", Key: filter.Key, Status: resp.StatusCode, Code: refusal.Code, Message: refusal.Error}
	}
	return &cancelBody{ReadCloser: resp.Body, cancel: cancel}, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// readEvents parses server-sent events until the stream ends or fn
// returns false.
func readEvents(r io.Reader, fn func(Event) bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var typ string
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() > 0 || typ != "" {
				var e Event
				_ = json.Unmarshal([]byte(data.String()), &e)
				if e.Type == "" {
					e.Type = typ
				}
				if !fn(e) {
					return
				}
			}
			typ = ""
			data.Reset()
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			typ = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
}

// wakeups follows one key's stream for a waiting acquisition: a release,
// expiry, loss or resync is a wake-up.
type wakeups struct {
	body   io.ReadCloser
	wake   chan struct{}
	broken chan struct{}
	done   chan struct{}
}

func (c *Client) subscribe(ctx context.Context, key string) (*wakeups, error) {
	return c.follow(ctx, EventFilter{Key: key})
}

func (c *Client) subscribePrefix(ctx context.Context, prefix string) (*wakeups, error) {
	return c.follow(ctx, EventFilter{Prefix: prefix})
}

func (c *Client) follow(ctx context.Context, filter EventFilter) (*wakeups, error) {
	body, err := c.openEvents(ctx, filter)
	if err != nil {
		return nil, err
	}
	w := &wakeups{body: body, wake: make(chan struct{}, 1), broken: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.broken)
		readEvents(body, func(e Event) bool {
			switch e.Type {
			case "released", "expired", "lost", "resync":
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}
			return true
		})
	}()
	return w, nil
}

// close ends the stream and waits for its reader; nil-safe, idempotent.
func (w *wakeups) close() {
	if w == nil {
		return
	}
	w.body.Close()
	<-w.done
}
