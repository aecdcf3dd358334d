//go:build go1.27

package driver

import (
	"database/sql"
	"database/sql/driver"
)

// As of Go 1.27 database/sql calls NextRow and ScanColumn instead of Next when the rows implement
// driver.RowsColumnScanner, and pgx's rows do: they scan into *[]string, pgtype.Array,
// pgtype.Range and the other destinations that driver.Value conversions cannot fill. The
// wrapper forwards them, so that scanning through pgtraffic is scanning through pgx.
var _ driver.RowsColumnScanner = (*rows)(nil)

// NextRow advances to the next row, finishing the statement at the end or on an error, as Next
// does.
func (r *rows) NextRow() error {
	var err error
	if cs, ok := r.Rows.(driver.RowsColumnScanner); ok {
		err = cs.NextRow()
	} else {
		// A parent without the interface (not pgx's): read the row with Next for ScanColumn.
		if r.vals == nil {
			r.vals = make([]driver.Value, len(r.Rows.Columns()))
		}
		err = r.Rows.Next(r.vals)
	}
	return r.advanced(err)
}

// ScanColumn copies column index of the current row into dest.
func (r *rows) ScanColumn(scanCtx driver.ScanContext, index int, dest any) error {
	if cs, ok := r.Rows.(driver.RowsColumnScanner); ok {
		return cs.ScanColumn(scanCtx, index, dest)
	}
	return sql.ConvertAssign(scanCtx, dest, r.vals[index])
}
