package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Sentinel errors. Every error this package returns matches (with
// errors.Is) at most one of the first group, chosen by the service's
// refusal code; an *Error carries the code, the HTTP status and the
// details.
var (
	// ErrNotAcquired: the lock is held by someone else (code "held"),
	// after the wait, if any.
	ErrNotAcquired = errors.New("fencelock: lock not acquired")
	// ErrNotHeld: a renewal or release named a lease that is no longer
	// held (code "not_held"): it expired, was force-released or released.
	ErrNotHeld = errors.New("fencelock: lease not held")
	// ErrStale: a fence refused a token because a higher one was admitted
	// (code "stale"): a newer holder exists, stop.
	ErrStale = errors.New("fencelock: stale fencing token")
	// ErrInvalid: the service refused the input (HTTP 400: bad_request,
	// invalid_key, invalid_owner, invalid_ttl, invalid_token), or the
	// client refused it before sending.
	ErrInvalid = errors.New("fencelock: invalid argument")
	// ErrUnsupported: the service's backend cannot do this (code
	// "unsupported").
	ErrUnsupported = errors.New("fencelock: unsupported")
	// ErrUnauthorized: missing or unknown bearer token (401).
	ErrUnauthorized = errors.New("fencelock: unauthorized")
	// ErrForbidden: a client token on an admin route (403).
	ErrForbidden = errors.New("fencelock: forbidden")
	// ErrNotFound: a free lock, a missing value, no such route (404).
	ErrNotFound = errors.New("fencelock: not found")
	// ErrTokensExhausted: the key's token counter reached its end (409
	// "tokens_exhausted").
	ErrTokensExhausted = errors.New("fencelock: tokens exhausted")
	// ErrUnavailable: no answer (connection refused or cut, time-out) or
	// a 503 ("unavailable", "timeout"): the outcome may be unknown and a
	// retry may succeed.
	ErrUnavailable = errors.New("fencelock: service unavailable")
	// ErrInternal: the service's backend failed for good (500) or the
	// service answered something this client cannot read.
	ErrInternal = errors.New("fencelock: internal service error")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("fencelock: client closed")

	// ErrLost: a held lock can no longer be trusted: a renewal was
	// refused, its local deadline passed without a confirmed renewal
	// (I5), or the client was closed. It is the cause of a lost Lock's
	// Context (context.Cause) and what Err returns.
	ErrLost = errors.New("fencelock: lock lost")
	// ErrReleased is the cause of a Lock's Context after Release.
	ErrReleased = errors.New("fencelock: lock released")
)

// Error is a refusal by the service, or a request that got no answer.
type Error struct {
	// Op is the operation ("acquire", "renew", "release", "admit", …).
	Op string
	// Key is the lock key or resource, when there is one.
	Key string
	// Status is the HTTP status, 0 when no answer came.
	Status int
	// Code is the service's stable code ("held", "not_held", "stale",
	// "invalid_ttl", …), "" when no answer came.
	Code string
	// Message is the service's one-line reason, or the transport error.
	Message string
	// Holder is the current holder, with code "held", when known.
	Holder *LockInfo
	// Current is the highest admitted token, with code "stale".
	Current *uint64
	// Err is the underlying error (transport, context), if any.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("fencelock: ")
	b.WriteString(e.Op)
	if e.Key != "" {
		fmt.Fprintf(&b, " %s", shorten(strconv.Quote(e.Key)))
	}
	b.WriteString(": ")
	if e.Status != 0 {
		fmt.Fprintf(&b, "%d %s: ", e.Status, e.Code)
	}
	b.WriteString(e.Message)
	return b.String()
}

// shortenTo is how much of a long input a message quotes: a 10,000-byte
// key or message is not repeated whole in every log line. The Rust core
// (fencelock_core::shorten) shortens its messages the same way.
const shortenTo = 64

// shorten keeps the first shortenTo bytes of s (cut at a character
// boundary) and says how long it was: `"aaaa…(10002 bytes)`.
func shorten(s string) string {
	if len(s) <= shortenTo {
		return s
	}
	cut := shortenTo
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

// Unwrap returns the underlying error (a transport or context error).
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of e's code (ErrNotAcquired for "held", …).
func (e *Error) Is(target error) bool {
	return e.sentinel() == target
}

func (e *Error) sentinel() error {
	if e.Status == 0 && e.Code == "" {
		switch {
		case e.Err == context.Canceled || e.Err == context.DeadlineExceeded:
			return nil // ended by the caller before any attempt
		case errors.Is(e.Err, ErrClosed):
			return ErrClosed
		}
	}
	switch e.Code {
	case "held":
		return ErrNotAcquired
	case "not_held":
		return ErrNotHeld
	case "stale":
		return ErrStale
	case "tokens_exhausted":
		return ErrTokensExhausted
	case "bad_request", "invalid_key", "invalid_owner", "invalid_ttl", "invalid_token":
		return ErrInvalid
	case "unsupported":
		return ErrUnsupported
	case "unauthorized":
		if e.Status == 500 {
			// The service's backend refused the service's credentials:
			// the service is misconfigured, not the caller's token.
			return ErrInternal
		}
		return ErrUnauthorized
	case "forbidden":
		return ErrForbidden
	case "not_found":
		return ErrNotFound
	case "unavailable", "timeout":
		return ErrUnavailable
	case "internal":
		return ErrInternal
	}
	switch {
	case e.Status == 0:
		return ErrUnavailable
	case e.Status == 400:
		return ErrInvalid
	case e.Status == 401:
		return ErrUnauthorized
	case e.Status == 403:
		return ErrForbidden
	case e.Status == 404:
		return ErrNotFound
	case e.Status == 502 || e.Status == 503 || e.Status == 504 || e.Status == 429:
		return ErrUnavailable
	}
	return ErrInternal
}

// transient reports whether a retry of the same request may succeed.
func (e *Error) transient() bool { return e.sentinel() == ErrUnavailable }

// LostError says why a Lock was lost; errors.Is(err, ErrLost) holds.
type LostError struct {
	Key   string
	Token uint64
	// Reason is "refused" (the service answered not_held to a renewal:
	// the lease expired and may have been taken, or was force-released),
	// "deadline" (no renewal was confirmed before the lease's local
	// deadline) or "closed" (the Client was closed).
	Reason string
	// Err is the last renewal error, if any.
	Err error
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("fencelock: lock %s (token %d) lost: %s", shorten(strconv.Quote(e.Key)), e.Token, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches ErrLost.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Unwrap returns the last renewal error, if any.
func (e *LostError) Unwrap() error { return e.Err }

// invalid is a refusal made by the client before sending anything.
func invalid(op, key, msg string) error {
	return &Error{Op: op, Key: key, Code: "bad_request", Message: msg}
}
