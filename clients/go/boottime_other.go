//go:build !linux

package fencelock

import "time"

// Elsewhere the monotonic deadline is all there is (macOS's monotonic
// clock already counts sleep).
func bootClock() (time.Duration, bool) { return 0, false }
