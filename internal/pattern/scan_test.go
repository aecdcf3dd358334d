package pattern

import pg "github.com/pganalyze/pg_query_go/v5"

func pgScan(sql string) ([]string, error) {
	r, err := pg.Scan(sql)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range r.Tokens {
		switch t.Token {
		case pg.Token_SCONST, pg.Token_USCONST, pg.Token_BCONST, pg.Token_XCONST:
			out = append(out, sql[t.Start:t.End])
		}
	}
	return out, nil
}
