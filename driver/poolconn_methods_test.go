package driver

import (
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPoolConnHasPgxpoolConnMethods: the README presents *Pool as pgxpool with
// control, with pgxpool's Acquire, AcquireFunc and AcquireAllIdle "whose connections are
// controlled too", and design.md gives Acquire as "a controlled connection". Code moving from
// pgxpool calls the acquired connection's methods (Exec, Query, ..., Release, Conn and Hijack, the
// pgxpool way to take a connection out of the pool for good, e.g. for a long-lived LISTEN).
// Every method of *pgxpool.Conn should therefore exist on *PoolConn with the same signature
// (as TestPoolHasPgxpoolMethods checks for *Pool), so that such code compiles unchanged but for
// the type name.
func TestPoolConnHasPgxpoolConnMethods(t *testing.T) {
	ours := reflect.TypeFor[*PoolConn]()
	theirs := reflect.TypeFor[*pgxpool.Conn]()
	sig := func(m reflect.Method) string {
		var in, out []string
		for i := 1; i < m.Type.NumIn(); i++ {
			in = append(in, m.Type.In(i).String())
		}
		for i := range m.Type.NumOut() {
			out = append(out, m.Type.Out(i).String())
		}
		return "(" + strings.Join(in, ", ") + ") (" + strings.Join(out, ", ") + ")"
	}
	for i := range theirs.NumMethod() {
		m := theirs.Method(i)
		o, ok := ours.MethodByName(m.Name)
		if !ok {
			t.Errorf("*PoolConn has no %s%s, which *pgxpool.Conn has", m.Name, sig(m))
			continue
		}
		if sig(o) != sig(m) {
			t.Errorf("%s: %s, pgxpool.Conn's %s", m.Name, sig(o), sig(m))
		}
	}
}
