package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestTableMatchFoldsAsSQL: a table match is read as the name would be in SQL. A guard scoped
// {table: Orders}, as the application writes DELETE FROM Orders (a table PostgreSQL names
// orders), refuses it; before, the scope compared Orders with the tag orders and protected
// nothing, the file loading without a word. {table: '"Orders"'} names the quoted table, and
// scopes DELETE FROM "Orders" only.
func TestTableMatchFoldsAsSQL(t *testing.T) {
	for _, tc := range []struct {
		scope, table, stmt string
	}{
		{"Orders", "Orders", "DELETE FROM Orders"},
		{"public.Orders", "Orders", "DELETE FROM PUBLIC.Orders"},
		{`'"Orders"'`, `"Orders"`, `DELETE FROM "Orders"`},
	} {
		cfg, err := driver.ParseConfig([]byte("guards:\n  require_where: {mode: enforce, match: {table: " + tc.scope + "}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		raw, db, _ := openBoth(t, driver.WithConfig(cfg))
		ctx := context.Background()
		if _, err := raw.ExecContext(ctx, "CREATE TABLE "+tc.table+" (id int); INSERT INTO "+tc.table+
			" SELECT generate_series(1, 10); CREATE TABLE other (id int)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, tc.stmt); !errors.Is(err, driver.ErrBlocked) {
			t.Errorf("%s under a guard scoped {table: %s}: %v, want refused", tc.stmt, tc.scope, err)
		}
		if _, err := db.ExecContext(ctx, "DELETE FROM other"); err != nil {
			t.Errorf("DELETE FROM other under a guard scoped {table: %s}: %v, want run", tc.scope, err)
		}
	}
	// A quoted scope is the quoted table's only: the folded one is another table.
	cfg, err := driver.ParseConfig([]byte("guards:\n  require_where: {mode: enforce, match: {table: '\"Orders\"'}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	raw, db, _ := openBoth(t, driver.WithConfig(cfg))
	if _, err := raw.Exec("CREATE TABLE orders (id int)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("DELETE FROM Orders"); err != nil {
		t.Errorf(`DELETE FROM Orders (table orders) under a guard scoped {table: '"Orders"'}: %v, want run`, err)
	}
}
