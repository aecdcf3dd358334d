package rules

import (
	"strings"
	"testing"
)

// TestTableName: a table match value stands for the name PostgreSQL resolves from it written in
// SQL: unquoted parts fold to lower case, quoted ones keep theirs ("" a quote).
func TestTableName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"orders", "orders"},
		{"Orders", "orders"},
		{"Public.ORDERS", "public.orders"},
		{`"Orders"`, "Orders"},
		{`public."Orders"`, "public.Orders"},
		{`"My.Table"`, "My.Table"},
		{`"a""b"`, `a"b`},
		{"Ünïcode", "Ünïcode"}, // only ASCII letters fold, as the server folds them
	} {
		got, err := TableName(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("TableName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := TableName(`"Orders`); err == nil {
		t.Error(`TableName("\"Orders") gave no error for an unterminated quote`)
	}
}

// TestTableMatchUnterminatedQuote: a rules file whose table match has an unterminated quote is
// refused, naming the field.
func TestTableMatchUnterminatedQuote(t *testing.T) {
	_, err := Parse([]byte("budgets: [{name: b, max_concurrent: 1}]\nrules: [{budget: b, match: {table: '\"Orders'}}]\n"))
	if err == nil || !strings.Contains(err.Error(), "table") || !strings.Contains(err.Error(), "unterminated") {
		t.Errorf("a table match with an unterminated quote: %v, want an error naming it", err)
	}
}
