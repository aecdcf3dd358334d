//go:build !race

package pattern

// raceEnabled shortens tests whose cost the race detector multiplies.
const raceEnabled = false
