//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos

package fencelock

import (
	"errors"
	"io"
	"net"
	"syscall"
)

const canCheckAlive = true

// newAliveCheck returns the check of an idle connection: a read of its
// socket without waiting, where nothing to read (EAGAIN) means the service
// has not closed it, and end of stream, an error or bytes nobody asked for
// mean the connection must not carry a request. One system call, where
// net/http keeps a reader goroutine per connection to find the same out;
// made once per connection, so that a check allocates nothing.
func newAliveCheck(nc net.Conn) func() error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return func() error { return errors.New("fencelock: not a socket") }
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() error { return err }
	}
	var state error
	var b [1]byte
	read := func(fd uintptr) bool {
		n, err := syscall.Read(int(fd), b[:])
		switch {
		case n == 0 && err == nil:
			state = io.EOF
		case n > 0:
			state = errUnasked
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			state = nil
		default:
			state = err
		}
		return true // never wait for the socket to be readable
	}
	return func() error {
		if err := rc.Read(read); err != nil {
			return err
		}
		return state
	}
}
