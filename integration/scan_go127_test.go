//go:build go1.27

package integration

// pgx's own database/sql scanning tests for Go 1.27 (stdlib/sql_go1.27_test.go of pgx v5.12),
// run through pgtraffic: as of Go 1.27 database/sql lets the driver scan each column
// (driver.RowsColumnScanner), and pgx scans arrays, ranges and multiranges into Go and pgtype
// values that driver.Value conversions cannot fill. Each test runs in every query exec mode
// pgx's does, under a budget that admits every statement, and checks afterwards that no
// statement still holds a slot.

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

var allExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

// knownOIDExecModes are the modes in which pgx knows a parameter's type before encoding it.
var knownOIDExecModes = allExecModes[:3]

// scanModes runs f against a pgtraffic *sql.DB in each of modes.
func scanModes(t *testing.T, modes []pgx.QueryExecMode, f func(t *testing.T, db *sql.DB)) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules, err := driver.ParseConfig([]byte(`
budgets:
  - {name: all, mode: enforce, max_concurrent: 2}
rules:
  - {budget: all, match: {database: ` + dbName(t, dsn) + `}}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			cfg, err := pgx.ParseConfig(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultQueryExecMode = mode
			c, err := driver.NewConnectorFromConfig(cfg, driver.WithConfig(rules))
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(c)
			defer db.Close()
			f(t, db)
			ensureDBValid(t, db)
			for _, b := range c.Snapshot().Budgets {
				if b.InFlight != 0 {
					t.Errorf("budget %s: %d statements still in flight", b.Name, b.InFlight)
				}
				if b.Admitted == 0 {
					t.Errorf("budget %s admitted nothing: the statements were not under traffic control", b.Name)
				}
			}
		})
	}
}

func dbName(t *testing.T, dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

// ensureDBValid is pgx's check that the pool still works after a test.
func ensureDBValid(t *testing.T, db *sql.DB) {
	t.Helper()
	rows, err := db.Query("select generate_series(1,$1)", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var sum, n int32
	for rows.Next() {
		var v int32
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		sum += v
		n++
	}
	if err := rows.Err(); err != nil || n != 10 || sum != 55 {
		t.Fatalf("generate_series(1,10): %d rows summing to %d, %v", n, sum, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func equal(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

func TestScanGoArray(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var names []string
		must(t, db.QueryRow("select array['John', 'Jane']::text[]").Scan(&names))
		equal(t, "names", names, []string{"John", "Jane"})
		var n int
		must(t, db.QueryRow("select cardinality($1::text[])", names).Scan(&n))
		equal(t, "cardinality", n, 2)
		must(t, db.QueryRow("select null::text[]").Scan(&names))
		equal(t, "null array", names, []string(nil))
	})
}

func TestScanGoArrayOfDriverValuer(t *testing.T) {
	scanModes(t, knownOIDExecModes, func(t *testing.T, db *sql.DB) {
		var names []sql.NullString
		must(t, db.QueryRow("select array['John', null, 'Jane']::text[]").Scan(&names))
		equal(t, "names", names, []sql.NullString{{String: "John", Valid: true}, {}, {String: "Jane", Valid: true}})
		var n int
		must(t, db.QueryRow("select cardinality($1::text[])", names).Scan(&n))
		equal(t, "cardinality", n, 3)
		must(t, db.QueryRow("select null::text[]").Scan(&names))
		equal(t, "null array", names, []sql.NullString(nil))
	})
}

func TestScanPGTypeFlatArray(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var names pgtype.FlatArray[string]
		must(t, db.QueryRow("select array['John', 'Jane']::text[]").Scan(&names))
		equal(t, "names", names, pgtype.FlatArray[string]{"John", "Jane"})
		var n int
		must(t, db.QueryRow("select cardinality($1::text[])", names).Scan(&n))
		equal(t, "cardinality", n, 2)
		must(t, db.QueryRow("select null::text[]").Scan(&names))
		equal(t, "null array", names, pgtype.FlatArray[string](nil))
	})
}

func TestScanPGTypeArray(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var matrix pgtype.Array[int64]
		must(t, db.QueryRow("select '{{1,2,3},{4,5,6}}'::bigint[]").Scan(&matrix))
		equal(t, "matrix", matrix, pgtype.Array[int64]{
			Elements: []int64{1, 2, 3, 4, 5, 6},
			Dims:     []pgtype.ArrayDimension{{Length: 2, LowerBound: 1}, {Length: 3, LowerBound: 1}},
			Valid:    true,
		})
		var same bool
		must(t, db.QueryRow("select '{{1,2,3},{4,5,6}}'::bigint[] = $1::bigint[]", matrix).Scan(&same))
		equal(t, "round trip", same, true)
		must(t, db.QueryRow("select null::bigint[]").Scan(&matrix))
		equal(t, "null matrix", matrix, pgtype.Array[int64]{})
	})
}

func TestScanPGTypeRange(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var r pgtype.Range[pgtype.Int4]
		must(t, db.QueryRow("select int4range(1, 5)").Scan(&r))
		equal(t, "range", r, pgtype.Range[pgtype.Int4]{
			Lower: pgtype.Int4{Int32: 1, Valid: true}, Upper: pgtype.Int4{Int32: 5, Valid: true},
			LowerType: pgtype.Inclusive, UpperType: pgtype.Exclusive, Valid: true,
		})
		var same bool
		must(t, db.QueryRow("select int4range(1, 5) = $1::int4range", r).Scan(&same))
		equal(t, "round trip", same, true)
		must(t, db.QueryRow("select null::int4range").Scan(&r))
		equal(t, "null range", r, pgtype.Range[pgtype.Int4]{})
	})
}

func TestScanPGTypeMultirange(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var r pgtype.Multirange[pgtype.Range[pgtype.Int4]]
		must(t, db.QueryRow("select int4multirange(int4range(1, 5), int4range(7,9))").Scan(&r))
		equal(t, "multirange", r, pgtype.Multirange[pgtype.Range[pgtype.Int4]]{
			{Lower: pgtype.Int4{Int32: 1, Valid: true}, Upper: pgtype.Int4{Int32: 5, Valid: true},
				LowerType: pgtype.Inclusive, UpperType: pgtype.Exclusive, Valid: true},
			{Lower: pgtype.Int4{Int32: 7, Valid: true}, Upper: pgtype.Int4{Int32: 9, Valid: true},
				LowerType: pgtype.Inclusive, UpperType: pgtype.Exclusive, Valid: true},
		})
		var same bool
		must(t, db.QueryRow("select int4multirange(int4range(1, 5), int4range(7,9)) = $1::int4multirange", r).Scan(&same))
		equal(t, "round trip", same, true)
		must(t, db.QueryRow("select null::int4multirange").Scan(&r))
		equal(t, "null multirange", r, pgtype.Multirange[pgtype.Range[pgtype.Int4]](nil))
	})
}

func TestScanBoolToString(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var s string
		must(t, db.QueryRow("select true").Scan(&s))
		equal(t, "true", s, "true")
		must(t, db.QueryRow("select false").Scan(&s))
		equal(t, "false", s, "false")
	})
}

func TestScanInterfacePreservesDatabaseSQLValues(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		for _, tt := range []struct {
			query string
			want  any
		}{
			{"select 42::int2", int64(42)},
			{"select 42::int4", int64(42)},
			{"select 42::int8", int64(42)},
			{"select 1.5::float4", float64(1.5)},
			{"select 1.25::numeric", "1.25"},
			{"select array[1,2]::int4[]", "{1,2}"},
			{"select '9007199254740993'::jsonb", []byte("9007199254740993")},
			{"select 'null'::jsonb", []byte("null")},
			{"select null::int4", nil},
		} {
			var got any
			must(t, db.QueryRow(tt.query).Scan(&got))
			equal(t, tt.query, got, tt.want)
			var indirect *any
			must(t, db.QueryRow(tt.query).Scan(&indirect))
			if tt.want == nil {
				equal(t, tt.query+" into *any", indirect, (*any)(nil))
			} else if indirect == nil {
				t.Errorf("%s into *any: nil", tt.query)
			} else {
				equal(t, tt.query+" into *any", *indirect, tt.want)
			}
		}
	})
}

func TestScanScalarPreservesDatabaseSQLConversions(t *testing.T) {
	type namedString string
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		for _, tt := range []struct{ query, want string }{
			{"select true", "true"},
			{"select '2026-09-07'::date", "2026-09-07T00:00:00Z"},
			{"select decode('6162', 'hex')", "ab"},
		} {
			var s string
			must(t, db.QueryRow(tt.query).Scan(&s))
			equal(t, tt.query+" into string", s, tt.want)
			var b []byte
			must(t, db.QueryRow(tt.query).Scan(&b))
			equal(t, tt.query+" into []byte", b, []byte(tt.want))
			var indirect *string
			must(t, db.QueryRow(tt.query).Scan(&indirect))
			if indirect == nil || *indirect != tt.want {
				t.Errorf("%s into *string: %v", tt.query, indirect)
			}
			rows, err := db.Query(tt.query)
			must(t, err)
			if !rows.Next() {
				t.Fatalf("%s: no row: %v", tt.query, rows.Err())
			}
			var raw sql.RawBytes
			must(t, rows.Scan(&raw))
			equal(t, tt.query+" into RawBytes", raw, sql.RawBytes(tt.want))
			must(t, rows.Close())
		}
		var named namedString
		must(t, db.QueryRow("select decode('6162', 'hex')").Scan(&named))
		equal(t, "named string", named, namedString("ab"))
		var s string
		if err := db.QueryRow("select null::jsonb").Scan(&s); err == nil {
			t.Error("null into string: no error")
		}
	})
}

type scanOnce struct {
	calls int
	err   error
}

func (s *scanOnce) Scan(any) error {
	s.calls++
	if s.calls == 1 {
		return s.err
	}
	return nil
}

func TestScanPreservesScannerError(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		for _, query := range []string{"select 42::int4", "select '1'::jsonb", "select null::int4"} {
			errRejected := errors.New("value rejected by scanner")
			s := &scanOnce{err: errRejected}
			if err := db.QueryRow(query).Scan(s); !errors.Is(err, errRejected) {
				t.Errorf("%s: %v, want the scanner's error", query, err)
			}
			equal(t, query+": Scan calls", s.calls, 1)
		}
	})
}

func TestScanRejectsNilDestination(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		for _, dest := range []any{nil, (*int64)(nil), (*string)(nil), (*[]int32)(nil), (*sql.NullString)(nil)} {
			for _, query := range []string{"select 42::int4", "select null::int4"} {
				if err := db.QueryRow(query).Scan(dest); err == nil {
					t.Errorf("%s into %#v: no error", query, dest)
				}
			}
		}
	})
}

func TestScanNativeByteSlices(t *testing.T) {
	scanModes(t, allExecModes, func(t *testing.T, db *sql.DB) {
		var a pgtype.FlatArray[byte]
		must(t, db.QueryRow("select array[1,2,3]::int2[]").Scan(&a))
		equal(t, "int2[] into FlatArray[byte]", a, pgtype.FlatArray[byte]{1, 2, 3})
		backing := make([]byte, 16)
		b := pgtype.PreallocBytes(backing)
		must(t, db.QueryRow("select decode('6162', 'hex')").Scan(&b))
		equal(t, "PreallocBytes", b, pgtype.PreallocBytes("ab"))
		if &backing[0] != &b[0] {
			t.Error("PreallocBytes did not scan into its backing array")
		}
	})
}

// TestScanInTransaction: the same scans inside a transaction and through a prepared statement,
// the other two ways rows reach database/sql.
func TestScanInTransaction(t *testing.T) {
	scanModes(t, allExecModes[:1], func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		must(t, err)
		defer tx.Rollback()
		var names []string
		must(t, tx.QueryRow("select array['a', 'b']::text[]").Scan(&names))
		equal(t, "in a transaction", names, []string{"a", "b"})
		st, err := tx.Prepare("select array[$1::text, 'c']")
		must(t, err)
		defer st.Close()
		must(t, st.QueryRow("b").Scan(&names))
		equal(t, "prepared", names, []string{"b", "c"})
		must(t, tx.Commit())
	})
}
