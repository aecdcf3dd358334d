package driver

import (
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// TestSecretNormalize checks that the normalised text, summary and tables of statements
// that carry a secret in a value position hold nothing of it.
func TestSecretNormalize(t *testing.T) {
	for _, q := range []string{
		`select * from users where password = 'S3CRET-LIT'`,
		`select * from users where password = E'S3CRET\'LIT'`,
		`select * from users where password = U&'S3CRET'`,
		`select * from users where pin = 4242424242 /*token='S3CRET'*/`,
		`select * from users where token = $tok$S3CRET$tok$`,
		`select * from users where token = X'5333435245545f'`,
		`create role bob password 'S3CRET'`,
		`alter role bob with password 'S3CRET'`,
		`alter user bob encrypted password 'S3CRET' valid until '2030-01-01'`,
		`set application_name = 'S3CRET'`,
		`set app.api_key = 'S3CRET'`,
		`set app.api_key to S3CRETWORD`,
		`set session authorization S3CRETUSER`,
		`select set_config('app.key', 'S3CRET', false)`,
		`do $$ begin perform 'S3CRET'; end $$`,
		`copy users from program 'curl S3CRET'`,
		`comment on table users is 'S3CRET'`,
		`notify chan, 'S3CRET'`,
		`create user mapping for bob server s options (user 'bob', password 'S3CRET')`,
		`create server s foreign data wrapper postgres_fdw options (host 'h', password 'S3CRET')`,
		`alter user mapping for bob server s options (set password 'S3CRET')`,
		`select 'S3CRET'::varchar(10)`,
		`select * from users where created > now() - interval '7 days' and pin = 88776655`,
		`insert into users(pin) values (88776655) on conflict do nothing`,
		`select * from users limit 88776655 offset 88776655`,
		`prepare p as select * from users where pin = 88776655`,
		`explain select * from users where password = 'S3CRET'`,
		`create table t (c text default 'S3CRET')`,
		`create function f() returns text language sql as 'select ''S3CRET'''`,
		`security label on table users is 'S3CRET'`,
		`select * from users where password = 'S3CRET' -- trailing`,
		`select * from dblink('host=h password=S3CRET', 'select 1') as t(a int)`,
		`select * from json_to_record('{"pw":"S3CRET"}') as x(pw text)`,
		`select * from xmltable('/r' passing '<r>S3CRET</r>' columns a text path 'S3CRET')`,
		`select * from unnest(array['S3CRET']) with ordinality`,
		`merge into users u using (values ('S3CRET')) v(pw) on u.pw = v.pw when matched then delete`,
		`with x as (select 'S3CRET' as pw) update users set pw = x.pw from x where users.id = 88776655 returning *`,
		`select * from users where pw similar to 'S3CRET' escape '#'`,
		`select now() at time zone 'S3CRET'`,
		`select date 'S3CRET', timestamp with time zone 'S3CRET', B'10101', 1e88776655`,
		`select * from users where password = 'S3CRET`, // unparsable
		`select * frm users where password = 'S3CRET'`, // unparsable
	} {
		p := pattern.Analyze(q)
		for _, s := range []string{p.Normalized, p.Summary, strings.Join(p.Tables, ","), strings.Join(p.Relations, ",")} {
			if strings.Contains(strings.ToUpper(s), "S3CRET") || strings.Contains(s, "88776655") || strings.Contains(s, "4242424242") {
				t.Errorf("%q: pattern exposes a value: normalized=%q summary=%q tables=%v", q, p.Normalized, p.Summary, p.Tables)
				break
			}
		}
	}
}
