//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || solaris || illumos

package fencelock

import (
	"errors"
	"io"
	"net"
	"syscall"
)

const canCheckAlive = true

// aliveCheck reads the idle connection's socket without waiting: nothing
// to read (EAGAIN) means the service has not closed it; end of stream, an
// error or bytes nobody asked for mean the connection must not carry a
// request. One system call, where net/http keeps a reader goroutine per
// connection to find the same out.
func aliveCheck(nc net.Conn) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return errors.New("fencelock: not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var state error
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
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
	})
	if err != nil {
		return err
	}
	return state
}
