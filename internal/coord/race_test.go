//go:build race

package coord

// raceEnabled: the race detector slows the client five to ten times; the scale test runs in the
// pass without it (make test RACE=), which is what a production binary is.
const raceEnabled = true
