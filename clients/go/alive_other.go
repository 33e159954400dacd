//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos)

package fencelock

import (
	"errors"
	"net"
)

// Without a non-blocking read of the socket, an idle connection's close by
// the service cannot be seen before a request is sent on it: requests go
// through net/http there (newWire returns nil).
const canCheckAlive = false

func newAliveCheck(net.Conn) func() error {
	return func() error { return errors.ErrUnsupported }
}
