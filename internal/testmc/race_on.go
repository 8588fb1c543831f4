//go:build race

package testmc

// RaceEnabled is true in a binary built with -race.
const RaceEnabled = true
