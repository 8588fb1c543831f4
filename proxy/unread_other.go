//go:build !linux

package proxy

// unreadBytes is unknown here: 0.
func unreadBytes(int) int { return 0 }
