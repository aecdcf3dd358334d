package driver

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestNamed: the engine decides a statement with named arguments by the text and values pgx
// sends: options before the rewriter are kept in front, the rewriter goes; anything else, and
// a rewrite that fails, is left as it is for pgx.
func TestNamed(t *testing.T) {
	ctx := context.Background()
	text, args := named(ctx, "delete from t where id = @id or @all", []any{pgx.QueryExecModeExec, pgx.NamedArgs{"id": 7, "all": true}})
	if text != "delete from t where id = $1 or $2" || !slices.Equal(args, []any{pgx.QueryExecModeExec, 7, true}) {
		t.Fatalf("named args: %q %v", text, args)
	}
	text, args = named(ctx, "delete from t where id = @id", []any{pgx.StrictNamedArgs{"id": 7}})
	if text != "delete from t where id = $1" || !slices.Equal(args, []any{7}) {
		t.Fatalf("strict named args: %q %v", text, args)
	}
	for _, in := range [][]any{nil, {1, 2}, {pgx.QueryExecModeSimpleProtocol, 1}, {pgx.StrictNamedArgs{}}} {
		text, args := named(ctx, "delete from t where id = @id", in)
		if text != "delete from t where id = @id" || len(args) != len(in) || len(in) > 0 && &args[0] != &in[0] {
			t.Fatalf("%v: %q %v, want them unchanged", in, text, args)
		}
	}
}
