package budget

import (
	"testing"
	"time"
)

func TestSetSharedOwners(t *testing.T) {
	b := New(Spec{MaxConcurrent: 1})
	now := time.Unix(1000, 0)
	o1, o2 := new(int), new(int)
	kick := func() {}
	b.SetShared(now, o1, kick, time.Second)
	b.SetShared(now, o2, kick, time.Second)
	b.SetShared(now, o1, nil, 0)
	if !b.keys.shared {
		t.Fatal("old owner's unshare made the budget local")
	}
	b.SetShared(now, o2, nil, 0)
	if b.keys.shared {
		t.Fatal("last owner's unshare left it shared")
	}
	// o1 unshares again after o2 shared again: nothing changes.
	b.SetShared(now, o2, kick, time.Second)
	b.SetShared(now, o1, nil, 0)
	if !b.keys.shared || b.link.kick == nil {
		t.Fatal("a stale unshare changed a shared budget")
	}
}
