package coord

import (
	"fmt"
	"testing"
	"time"
)

// TestSlotsLoadShiftHandsOver is a load that moves from one instance to another (a load
// balancer fails A's traffic over to B): two instances share max_concurrent 64; A runs 48
// workers for four intervals while B is idle, then A stops and B runs 32. From then on the
// fleet has at most 32 statements in flight, half the limit, and A none, so B is refused
// only during the hand-over: its early syncs report its demand and say so on the want
// channel, A syncs early, its estimate falling eight times as fast as without the messages,
// and hands its slots back, and B's next early syncs take them. B's refused statements retry
// without waiting and the coordinator visits its budget at each (eager), so B reports its
// demand a step at a time, as a real instance does. The refusals end within five eighths of
// an interval of the shift (four early syncs, with an eighth to spare; an interval or more
// without the faster fall), and the messages stop once the hand-over is done.
func TestSlotsLoadShiftHandsOver(t *testing.T) {
	const shift = 5 * time.Second
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := slotConfig{name: fmt.Sprintf("shift-%d", seed), instances: 2, limit: 64, interval: time.Second,
				stmt: 2 * time.Millisecond, duration: shift + 3*time.Second, seed: seed, listen: true, eager: true,
				workers: func(i int, el time.Duration) int {
					switch {
					case i == 0 && el >= time.Second && el < shift-10*time.Millisecond: // its last statements end before the shift
						return 48
					case i == 1 && el >= shift:
						return 32
					}
					return 0
				}}
			r := simulateSlots(t, cfg)
			refused, last := 0, time.Duration(-1)
			for _, x := range r.refusals {
				if x.at >= shift {
					if x.instance != 1 || x.fleet > 32 {
						t.Fatalf("a refusal after the shift on instance %d with %d in flight on the fleet", x.instance, x.fleet)
					}
					refused++
					last = x.at - shift
				}
			}
			messages, lastMessage := 0, time.Duration(-1)
			for _, at := range r.messages {
				if at >= shift {
					messages++
					lastMessage = at - shift
				}
			}
			t.Logf("B after the shift: %d refused, the last %v after it; %d want messages, the last %v after it; at most %d in flight",
				refused, last, messages, lastMessage, r.most)
			if limit := 5 * shortGap(cfg.interval); last > limit {
				t.Errorf("B refused %d statements after the shift, the last %v after it, with at most 32 of 64 in flight on the fleet; want none after %v",
					refused, last, limit)
			}
			if lastMessage > cfg.interval {
				t.Errorf("want messages went on %v after the shift: the hand-over was done long before", lastMessage)
			}
			if r.most > cfg.limit {
				t.Errorf("%d in flight, max_concurrent %d", r.most, cfg.limit)
			}
		})
	}
}

// TestSlotsSaturatedSendsNoMessages: two instances each want more than their half of
// max_concurrent 64 (48 workers each, retrying at once). Each reports its demand a step at a
// time (its grant and the statements refused since the last visit), so the start's hand-over
// to the second goes a step per early sync, each with a message; once it is done each holds
// 32, its fair share, and wants more, and neither holds more than its target or its want: the
// want channel goes quiet, so a saturated budget costs no early syncs.
func TestSlotsSaturatedSendsNoMessages(t *testing.T) {
	for seed := uint64(1); seed <= 1; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := slotConfig{name: fmt.Sprintf("saturated-%d", seed), instances: 2, limit: 64, interval: time.Second,
				stmt: 2 * time.Millisecond, duration: 9 * time.Second, seed: seed, listen: true, eager: true,
				workers: func(int, time.Duration) int { return 48 }}
			r := simulateSlots(t, cfg)
			quiet := cfg.duration - 2*cfg.interval
			late, lastMessage := 0, time.Duration(0)
			for _, at := range r.messages {
				lastMessage = at
				if at >= quiet {
					late++
				}
			}
			var slots []int
			for _, in := range r.insts {
				slots = append(slots, in.c.entries()[0].core.parts[""].grant.Slots)
			}
			t.Logf("%d want messages, the last at %v; slots at the end %v; at most %d in flight",
				len(r.messages), lastMessage, slots, r.most)
			if late > 0 {
				t.Errorf("%d want messages in the last two intervals, the budget saturated", late)
			}
			if slots[0] != 32 || slots[1] != 32 {
				t.Errorf("slots at the end %v, want the fair shares 32 and 32", slots)
			}
			if r.most > cfg.limit {
				t.Errorf("%d in flight, max_concurrent %d", r.most, cfg.limit)
			}
		})
	}
}
