//go:build !race

package proxy

// raceEnabled: the race detector is on; timing targets are not checked.
const raceEnabled = false
