//go:build race

package budget

// raceEnabled shortens the heaviest tests under the race detector, which
// slows map and heap work about tenfold.
const raceEnabled = true
