package guard

import "testing"

// TestComplementaryPairs: disjunctions of complementary forms cover every row whose operands
// are not null, and a write restricted by one is not restricted at all; the same forms with
// different operands restrict.
func TestComplementaryPairs(t *testing.T) {
	for where, unsafe := range map[string]bool{
		"id IN (5) OR id NOT IN (5)":                       true,
		"id IN (5, 6) OR id NOT IN (5, 6)":                 true,
		"id = 5 OR id NOT IN (5)":                          true,
		"id IN (5) OR id <> 5":                             true,
		"name LIKE 'a%' OR name NOT LIKE 'a%'":             true,
		"name ILIKE 'a%' OR name NOT ILIKE 'a%'":           true,
		"name SIMILAR TO 'a%' OR name NOT SIMILAR TO 'a%'": true,
		"id BETWEEN 1 AND 5 OR id NOT BETWEEN 1 AND 5":     true,
		"id = ANY($1) OR id <> ALL($1)":                    true,
		"id = 5 OR id IS DISTINCT FROM 5":                  true,
		"id IN (5) OR id NOT IN (6)":                       false,
		"name LIKE 'a%' OR name NOT LIKE 'b%'":             false,
		"id BETWEEN 1 AND 5 OR id NOT BETWEEN 1 AND 6":     false,
		"id = ANY($1) OR id <> ALL($2)":                    false,
		"id = 5 OR id IS DISTINCT FROM 6":                  false,
		"id IN (5) OR tenant NOT IN (5)":                   false,
	} {
		sql := "DELETE FROM t WHERE " + where
		if f := facts(sql); f.UnsafeWrite != unsafe {
			t.Errorf("%q: UnsafeWrite=%v, want %v", sql, f.UnsafeWrite, unsafe)
		}
	}
}
