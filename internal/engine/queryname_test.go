package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/tagging"
)

func TestQueryName(t *testing.T) {
	for _, tc := range []struct {
		name, query, want string
	}{
		{"sqlc one", "-- name: GetOrder :one\nSELECT * FROM orders WHERE id = $1", "GetOrder"},
		{"sqlc many", "-- name: ListOrders :many\nSELECT * FROM orders", "ListOrders"},
		{"underscore and digits", "-- name: list_orders_2 :many\nselect 1", "list_orders_2"},
		{"leading white space", "\n\t  -- name: ListOrders :many\nselect 1", "ListOrders"},
		{"name ends the text", "-- name: ListOrders", "ListOrders"},
		{"CRLF", "-- name: ListOrders\r\nselect 1", "ListOrders"},
		{"no comment", "SELECT * FROM orders", ""},
		{"empty", "", ""},
		{"another comment first", "/* x */ -- name: ListOrders :many\nselect 1", ""},
		{"not leading", "select 1 -- name: ListOrders :many", ""},
		{"other dash comment", "-- list orders\nselect 1", ""},
		{"no space after colon", "-- name:ListOrders :many\nselect 1", ""},
		{"empty name", "-- name:  :many\nselect 1", ""},
		{"starts with a digit", "-- name: 2Orders :many\nselect 1", ""},
		{"quote in name", "-- name: List'Orders :many\nselect 1", ""},
		{"punctuation after name", "-- name: ListOrders; drop :many\nselect 1", ""},
		{"non-ASCII", "-- name: Listé :many\nselect 1", ""},
		{"longest name", "-- name: " + strings.Repeat("a", maxQueryNameLen) + " :one", strings.Repeat("a", maxQueryNameLen)},
		{"too long", "-- name: " + strings.Repeat("a", maxQueryNameLen+1) + " :one", ""},
		{"too much leading space", strings.Repeat(" ", maxLeadingSpace+1) + "-- name: ListOrders :many", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := queryName(tc.query); got != tc.want {
				t.Fatalf("queryName(%q) = %q, want %q", tc.query, got, tc.want)
			}
		})
	}
}

// TestQueryNameSelectsOneQuery: a rule on query_name selects the sqlc query of that name and no
// other, not even one with the same body (they share a pattern, whose cache key drops leading
// comments); a comment or context tag can neither claim the name nor take it away.
func TestQueryNameSelectsOneQuery(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: list, mode: enforce, max_concurrent: 1}
rules:
  - {budget: list, match: {query_name: ListOrders}}
`, func(o *Options) { o.Observer = obs })
	const (
		list  = "-- name: ListOrders :many\nSELECT id FROM orders ORDER BY id\n"
		other = "-- name: ListOrdersAgain :many\nSELECT id FROM orders ORDER BY id\n"
	)
	bg := context.Background()
	hold, err := begin(e, bg, list)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Finish(bg, nil)
	if got, _ := tagValue(obs.tags, vocab.KeyQueryName); got != "ListOrders" {
		t.Fatalf("query_name tag %q, want ListOrders (tags %v)", got, obs.tags)
	}
	claimCtx := tagging.With(bg, vocab.KeyQueryName, "ListOrders")
	hideCtx := tagging.With(bg, vocab.KeyQueryName, "Other")
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		query   string
		refused bool
	}{
		{"the named query again", bg, list, true},
		{"the named query, context tag claims another name", hideCtx, list, true},
		{"the named query, comment claims another name", bg, list + "/*query_name='Other'*/", true},
		{"same body, other name", bg, other, false},
		{"same body, no name", bg, "SELECT id FROM orders ORDER BY id", false},
		{"context tag claims the name", claimCtx, other, false},
		{"comment claims the name", bg, "SELECT id FROM orders /*query_name='ListOrders'*/", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 { // the second time from the text cache's saved route
				x, err := begin(e, tc.ctx, tc.query)
				if err == nil {
					x.Finish(tc.ctx, nil)
				}
				if tc.refused {
					if d := denial(t, err); d.Budget != "list" || d.Reason != vocab.ReasonConcurrency {
						t.Fatalf("refused by %+v, want list's concurrency", d)
					}
				} else if err != nil {
					t.Fatalf("refused: %v", err)
				}
			}
		})
	}
}

// FuzzQueryName: whatever the text, the name is empty or a bounded ASCII identifier that the
// text's leading sqlc comment spells.
func FuzzQueryName(f *testing.F) {
	for _, s := range []string{"-- name: ListOrders :many\nselect 1", " -- name: a", "-- name: ", "select 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, query string) {
		name := queryName(query)
		if name == "" {
			return
		}
		if len(name) > maxQueryNameLen {
			t.Fatalf("name of %d bytes", len(name))
		}
		for i := 0; i < len(name); i++ {
			if !isIdentByte(name[i], i == 0) {
				t.Fatalf("name %q: byte %d is not an identifier's", name, i)
			}
		}
		if !strings.Contains(query, queryNamePrefix+name) {
			t.Fatalf("name %q is not in %q", name, query)
		}
	})
}
