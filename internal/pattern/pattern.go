package pattern

import (
	"encoding/binary"
	"hash/fnv"
	"hash/maphash"
	"slices"
	"sort"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/guard"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// maxSummary is the OpenTelemetry limit on db.query.summary.
const maxSummary = 255

// Pattern is what the engine knows about one statement text. It is immutable
// once built and shared by every execution of texts with the same [Key]: its
// fields, including the Tables slice, must not be modified.
type Pattern struct {
	// Fingerprint is pg_query's fingerprint as 16 lower-case hex digits for a
	// text of SELECT, INSERT, UPDATE, DELETE and MERGE whose normalised text
	// pg_query left no literal in; for any other text, parsed or not, FNV-1a 64
	// of its tokens without their values (unparsableID), also 16 hex digits.
	Fingerprint string
	// FingerprintID is Fingerprint as a number, for map keys.
	FingerprintID uint64
	// Normalized is the text with every quoted literal replaced by $n and
	// comments removed (pg_query.Normalize, then a scrub of the quoted
	// literals it leaves in DDL, COPY and COMMENT). Numeric type modifiers
	// such as varchar(10) stay. "" for unparsable text, never the raw text.
	//
	// It is cut, once and here, to [bounded.QueryLen] bytes, ending then with a marker saying
	// how many bytes were cut ([bounded.Cut]): it is what spans, the debug log and the status
	// page show of the statement, and a bulk INSERT's whole text would be megabytes in each.
	// Nothing needs the whole: the fingerprint is pg_query's of the text itself, the kind,
	// tables and guard facts come from the parse tree, and the cost from the statement.
	//
	// Normalized, Tables and Summary are valid UTF-8, whatever the text's bytes, so that
	// telemetry and the status page show them as they are: pg_query refuses a text that is not
	// (it is unparsable, with no texts), and what it returns is checked once here all the same
	// (invalid bytes would become U+FFFD), rather than by every reader on every statement.
	Normalized string
	// Kind is the statement kind (vocab.KindSelect ... vocab.KindOther) of the first
	// statement; vocab.KindOther for an empty or unparsable text. SELECT ... INTO
	// is vocab.KindDDL like CREATE TABLE AS, and TRUNCATE is vocab.KindDDL as in most
	// databases' classification (it takes an ACCESS EXCLUSIVE lock and is
	// not MVCC-safe); the Truncate fact flags it separately.
	Kind string
	// Tables are the relations referenced anywhere in the text, including
	// DDL targets, as written (schema-qualified only if written so),
	// deduplicated and sorted. CTE names are not tables.
	Tables []string
	// Relations are the relation names of the Tables written schema-qualified, without their
	// schema (public.orders gives orders), that are not in Tables already: a statement is
	// tagged table= with each too, so that a rule or guard on a table's bare name matches it
	// however it is written. Sorted; nil when none.
	Relations []string
	// Operation is db.operation.name: the first statement's command, as
	// PostgreSQL's command tag names it ("SELECT", "CREATE TABLE", "BEGIN").
	Operation string
	// Summary is db.query.summary: each operation followed by the tables it
	// names, in the order they appear ("INSERT orders SELECT carts"), at most
	// 255 bytes.
	Summary string
	// Parsed is false when pg_query could not parse the text, or was not given it because it
	// nests too deep (see [Analyze]).
	Parsed bool
	// Statements is the number of statements in the text.
	Statements int
	// Explainable reports a single SELECT, INSERT, UPDATE, DELETE or MERGE
	// (VALUES, TABLE, WITH and FOR UPDATE included; SELECT ... INTO not).
	Explainable bool
	// Transaction reports a single statement that begins, ends or marks a
	// transaction (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, ROLLBACK TO,
	// PREPARE TRANSACTION, COMMIT and ROLLBACK PREPARED): the engine decides
	// none, as the drivers' own Begin and Commit are not decided, so that a
	// budget never keeps a transaction open, holding its locks, by refusing
	// the statement that ends it.
	Transaction bool
	// Facts are the guard facts of the text, computed once here (UnsafeWrite:
	// an UPDATE, DELETE or MERGE that does not restrict its target's rows;
	// Truncate: a TRUNCATE). For a text that pg_query cannot parse (Parsed
	// false), that it may hold one.
	guard.Facts
}

// Analyze computes the Pattern of sql without a cache. It works on Key(sql),
// so it agrees with [Cache.Get]. It never fails and never panics on any
// input; pg_query parses the text at most three times (tree, fingerprint,
// normalisation), which is why callers should go through a [Cache].
//
// A text nested more than 1,000 levels deep (maxNesting: operators chained in one
// expression, set operations, joins, parentheses) is unparsable without being given to
// pg_query, whose C code would overflow its thread's stack on a deep enough one and kill the
// process; to tell, a text of more than 1,000 bytes is scanned once more.
func Analyze(sql string) *Pattern {
	return analyze(Key(sql))
}

func analyze(key string) *Pattern {
	if !parsableDepth(key) {
		return unparsable(key)
	}
	tree, err := pg.Parse(key)
	if err != nil {
		return unparsable(key)
	}
	dml := !slices.ContainsFunc(tree.Stmts, func(s *pg.RawStmt) bool { return !dmlNode(s.Stmt) })
	normalized, left := normalize(key, dml)
	var id uint64
	queryFingerprint := false
	if left == otherLiterals || !dml {
		// pg_query's fingerprint hashes the literals of utility statements (ALTER ROLE ...
		// PASSWORD, a subscription's connection string, COMMENT ON, a NOTIFY payload), even
		// where its normalised text replaced them: the fingerprint, which telemetry and errors
		// show, would let whoever knows the statement's shape recover a short secret by trying
		// each value. A text that is not all DML, or where a literal other than a whole number
		// was left behind, is fingerprinted by its tokens, values by their kind alone, as a
		// text pg_query cannot parse is. The whole numbers pg_query leaves in DML are the
		// positions of ORDER BY 1, GROUP BY 1 and DISTINCT ON (1), constants its fingerprint
		// ignores as it ignores every value: so a report grouped by position is one pattern
		// however long its IN lists and arrays, as pg_query's fingerprint collapses them.
		id = unparsableID(key, dml)
	} else if id, err = pg.FingerprintToUInt64(key); err != nil {
		return unparsable(key)
	} else {
		queryFingerprint = true
	}
	p := &Pattern{
		Normalized: bounded.Cut(normalized, bounded.QueryLen),
		Kind:       vocab.KindOther,
		Parsed:     true,
		Statements: len(tree.Stmts),
	}
	w := walker{tables: map[string]struct{}{}, bare: map[string]struct{}{}}
	for i, raw := range tree.Stmts {
		kind, op := classify(raw.Stmt)
		w.stmtLoc = int(raw.StmtLocation)
		if !dmlNode(raw.Stmt) {
			// SELECT and DML record their own operations, anchored in
			// the text; other statements are named here.
			w.events = append(w.events, event{loc: w.stmtLoc, op: op, stmt: true})
		}
		if i == 0 {
			p.Kind, p.Operation = kind, op
			p.Explainable = len(tree.Stmts) == 1 && explainable(raw.Stmt)
			p.Transaction = len(tree.Stmts) == 1 && raw.Stmt.GetTransactionStmt() != nil
		}
		w.node(raw.Stmt)
	}
	p.Facts = guard.Check(tree)
	if dependsOnSetting(key) {
		// A server with standard_conforming_strings off runs other statements than pg_query
		// read: judge those too. What pg_query read as names and words may be a string's
		// value there ('a\' , secret , '): the text shows no normalised text and is
		// fingerprinted by its tokens as that server reads them, values by their kind alone.
		off := offFacts(key)
		p.UnsafeWrite = p.UnsafeWrite || off.UnsafeWrite
		p.Truncate = p.Truncate || off.Truncate
		p.Normalized, queryFingerprint, id = "", false, offID(key)
	}
	p.Tables = make([]string, 0, len(w.tables))
	for t := range w.tables {
		p.Tables = append(p.Tables, t)
	}
	sort.Strings(p.Tables)
	if queryFingerprint {
		id = mix(numberedTables(id, p.Tables), w.valueClauses)
	}
	p.FingerprintID, p.Fingerprint = id, vocab.FingerprintHex(id)
	for t := range w.bare {
		if _, ok := w.tables[t]; !ok {
			p.Relations = append(p.Relations, t)
		}
	}
	sort.Strings(p.Relations)
	p.Summary = w.summary()
	if p.Summary == "" {
		p.Summary = p.Operation // SELECT 1
	}
	return p
}

// offID is the fingerprint of key as a server with standard_conforming_strings off reads it
// (offReading): its tokens, as unparsableID hashes them; where that reading cannot be written,
// key's tokens.
func offID(key string) uint64 {
	if text, ok := offReading(key); ok {
		return unparsableID(text, false)
	}
	return unparsableID(key, false)
}

// offFacts are the guard facts of key as a server with standard_conforming_strings off reads
// it (offReading): parsed, what it runs there; none when it does not parse, since that server
// rejects it too and runs nothing (a string of 'C:\' then ends at the next quote, and the rest
// is seldom SQL, or never ends). Where the off reading cannot be written for pg_query, or nests
// too deep for it, they are the facts of key's words, as for text pg_query cannot parse.
func offFacts(key string) guard.Facts {
	text, ok := offReading(key)
	if !ok || !parsableDepth(text) {
		return guard.Unparsed(key)
	}
	tree, err := pg.Parse(text)
	if err != nil {
		return guard.Facts{}
	}
	return guard.Check(tree)
}

// numberedTables is pg_query's fingerprint id of a text of tables, with the names of those of its
// tables that hold two digits in a row mixed in: pg_query's fingerprint leaves such digits out
// of a table's name (for a temporary table's random suffix, a partition's number), so that
// events_202401 and events_202402 would share one pattern, their costs, plan and quarantines,
// though they are different relations. A text of other tables keeps pg_query's fingerprint.
func numberedTables(id uint64, tables []string) uint64 {
	var numbered []string
	for _, t := range tables {
		if digitRun(t) {
			numbered = append(numbered, t)
		}
	}
	return mix(id, numbered)
}

// mix is id with parts mixed in (FNV-1a over id and each part, each ended by a NUL); id itself
// when there is none.
func mix(id uint64, parts []string) uint64 {
	if len(parts) == 0 {
		return id
	}
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	h.Write(b[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// digitRun reports whether s holds two ASCII digits in a row.
func digitRun(s string) bool {
	for i := 1; i < len(s); i++ {
		if isDigit(s[i]) && isDigit(s[i-1]) {
			return true
		}
	}
	return false
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// unparsable is the Pattern of text pg_query rejects. The server may still run it, so a text
// that may write is flagged by the guard facts of its words ([guard.Unparsed]).
func unparsable(key string) *Pattern {
	id := unparsableID(key, false)
	p := &Pattern{Fingerprint: vocab.FingerprintHex(id), FingerprintID: id, Kind: vocab.KindOther, Tables: []string{}}
	p.Facts = guard.Unparsed(key)
	return p
}

// unparsableID is the fingerprint of a text pg_query cannot parse (a newer server's syntax, a
// typo). It hashes the text's tokens as the scanner reads them, each token's kind and, but for
// literals, parameters and comments, its text (case-folded): so that one statement shape is one
// pattern whatever its values (its refusals, quarantine strikes and learned cost count
// together), and so that the fingerprint, which telemetry and errors show, holds nothing of its
// literals. Every value hashes alike however it is written: a number (its sign, [sign], not
// hashed; a decimal, 10.5 or 1e3, as an integer), a string of any quoting, a parameter: so -10,
// 10, 10.5, '10' and $1 make one pattern, as pg_query's fingerprint has them. A hash of the whole text would let whoever sees
// the fingerprint and knows the statement's shape recover a short literal (a PIN, a small id)
// by trying each value. A text the scanner rejects too (an unterminated quote) is hashed whole,
// with a key drawn at random per process: still one pattern per text, but a hash nobody outside
// can recompute to test a guess.
func unparsableID(key string, dml bool) uint64 {
	scan, err := pg.Scan(key)
	if err != nil {
		return maphash.String(unparsableSeed, key)
	}
	var setting []bool
	if !dml {
		setting = settingValues(scan.Tokens)
	}
	h := fnv.New64a()
	var kind [4]byte
	for i, t := range scan.Tokens {
		tok := t.Token
		switch {
		case tok == pg.Token_SQL_COMMENT, tok == pg.Token_C_COMMENT, sign(scan.Tokens, i):
			continue
		case value(tok) || setting != nil && setting[i]:
			// Every value hashes alike, as ICONST (so that a text with only numbers keeps the
			// fingerprint it has always had: rules and dashboards name fingerprints): a number,
			// a string and a parameter are one value, as pg_query's fingerprint has them. So the
			// text as sent, literals inline, and the text pg_stat_statements or pg_stat_activity
			// shows ($n) make one pattern, which a rule copied from either catches.
			tok = pg.Token_ICONST
		}
		binary.LittleEndian.PutUint32(kind[:], uint32(tok))
		h.Write(kind[:])
		if tok != pg.Token_ICONST { // a value: nothing of its text
			h.Write([]byte(strings.ToLower(key[t.Start:t.End])))
		}
	}
	return h.Sum64()
}

// value reports the tokens that are a statement's values: literals and parameters.
func value(t pg.Token) bool {
	switch t {
	case pg.Token_ICONST, pg.Token_FCONST, pg.Token_SCONST, pg.Token_USCONST, pg.Token_BCONST,
		pg.Token_XCONST, pg.Token_PARAM:
		return true
	}
	return false
}

// sign reports whether tokens[i] is the minus of a negative number: a "-" right before a
// number, where it cannot subtract. PostgreSQL's grammar folds such a minus into the constant,
// so pg_query's normalised text and fingerprint take -10 as one value, and so do normalize and
// unparsableID. After an identifier, a value, or a closing parenthesis or bracket (comments
// aside) the minus subtracts. After a keyword it is taken for a sign (THEN -1, INCREMENT BY -1),
// although a few keywords can name a column: "name - 1" then hashes as "name" before a number,
// still apart from "name + 1".
func sign(tokens []*pg.ScanToken, i int) bool {
	if tokens[i].Token != pg.Token_ASCII_45 || i+1 == len(tokens) ||
		tokens[i+1].Token != pg.Token_ICONST && tokens[i+1].Token != pg.Token_FCONST {
		return false
	}
	for i--; i >= 0; i-- {
		switch t := tokens[i].Token; t {
		case pg.Token_SQL_COMMENT, pg.Token_C_COMMENT:
			continue
		case pg.Token_IDENT, pg.Token_UIDENT, pg.Token_ASCII_41, pg.Token_ASCII_93: // ) ]
			return false
		default:
			return !value(t)
		}
	}
	return true
}

// unparsableSeed keys the hash of a text that neither the parser nor the scanner reads
// (unparsableID).
var unparsableSeed = maphash.MakeSeed()

// normalize returns pg_query's normalised text with comments removed and
// every literal it left behind replaced by a further $n: pg_query keeps the
// literals of utility statements (DDL defaults, COPY file names, COMMENT ON,
// CALL and EXECUTE arguments, FETCH counts), a negative number's minus with it
// ([sign]), as pg_query does. Only numbers in a type modifier or array bound
// after a built-in type keyword stay, such as varchar(10) or numeric(10,2). On
// any failure it returns "": losing the text is better than leaking a literal
// into telemetry. left says what literals pg_query left behind (a comment does not count),
// which its fingerprint may then hold too (a utility statement's values are in it; the
// positions of a DML statement's ORDER BY 1 are not); otherLiterals on a failure, where it
// cannot tell.
func normalize(key string, dml bool) (_ string, left leftover) {
	n, err := pg.Normalize(key)
	if err != nil {
		return "", otherLiterals
	}
	scan, err := pg.Scan(n)
	if err != nil {
		return "", otherLiterals
	}
	scrub, dirty, left := marks(scan.Tokens, dml)
	if !dirty {
		return n, left
	}
	return rewrite(n, scan.Tokens, scrub), left
}

// leftover is what pg_query's normalisation left of a text's literals (normalize).
type leftover uint8

const (
	noLiterals    leftover = iota
	wholeNumbers           // integers only, in DML the positions of ORDER BY 1 and GROUP BY 1
	otherLiterals          // a string or a decimal, or normalize cannot tell
)

// marks marks the tokens normalize replaces (scrub): the literals pg_query left, and a
// number's sign with it, but numbers in a type modifier; in a text other than DML, the words
// given as a setting's value (settingValues); and comments. dirty reports that it marked some;
// left, what literals they are.
func marks(tokens []*pg.ScanToken, dml bool) (scrub []bool, dirty bool, left leftover) {
	scrub = make([]bool, len(tokens))
	if !dml {
		for i, v := range settingValues(tokens) {
			if v {
				scrub[i], dirty, left = true, true, otherLiterals
			}
		}
	}
	// typmod tracks, for each open parenthesis or bracket, whether it holds a type modifier.
	var typmod []bool
	for i, t := range tokens {
		switch t.Token {
		case pg.Token_ASCII_40, pg.Token_ASCII_91: // ( [
			typmod = append(typmod, i > 0 && (typeKeyword(tokens[i-1].Token) ||
				t.Token == pg.Token_ASCII_91 && inTypmod(typmod)))
		case pg.Token_ASCII_41, pg.Token_ASCII_93: // ) ]
			if len(typmod) > 0 {
				typmod = typmod[:len(typmod)-1]
			}
		case pg.Token_ICONST, pg.Token_FCONST:
			if !inTypmod(typmod) {
				scrub[i], dirty = true, true
				if t.Token == pg.Token_ICONST {
					left = max(left, wholeNumbers)
				} else {
					left = otherLiterals
				}
				if i > 0 && sign(tokens, i-1) {
					scrub[i-1] = true // -1 is $n, as pg_query writes it where it replaces it
				}
			}
		case pg.Token_SCONST, pg.Token_USCONST, pg.Token_BCONST, pg.Token_XCONST:
			scrub[i], dirty, left = true, true, otherLiterals
		case pg.Token_SQL_COMMENT, pg.Token_C_COMMENT:
			scrub[i], dirty = true, true
		}
	}
	return scrub, dirty, left
}

// settingValues marks the words given as a setting's value in a statement other than DML:
// SET k = v, SET k TO v, ALTER ROLE, DATABASE or SYSTEM … SET k = v, a function's SET clause.
// PostgreSQL reads a bare word or a quoted identifier there as a string constant, and it may
// hold a secret as a literal may (SET app.api_key = S3CRET), but the scanner reads it as an
// identifier, which normalisation and the token fingerprint would keep. Every identifier from
// the = or TO to the end of the statement is marked: a value list (SET search_path = a, b)
// included, and in ALTER TABLE … SET (option = value, …) the options' names too, which is
// more than needed but never less.
func settingValues(tokens []*pg.ScanToken) []bool {
	marked := make([]bool, len(tokens))
	const (
		outside = iota
		named   // after SET, before its = or TO
		valued  // after its = or TO
	)
	state := outside
	for i, t := range tokens {
		switch t.Token {
		case pg.Token_SET:
			state = named
		case pg.Token_ASCII_59: // ;
			state = outside
		case pg.Token_ASCII_61, pg.Token_TO: // =
			if state == named {
				state = valued
			}
		case pg.Token_IDENT, pg.Token_UIDENT:
			marked[i] = state == valued
		}
	}
	return marked
}

// rewrite returns n, scanned into tokens, with each literal marked in scrub replaced by the
// next $n after those n holds, a number's sign with it, and each comment removed.
func rewrite(n string, tokens []*pg.ScanToken, scrub []bool) string {
	next := 1
	for _, t := range tokens {
		if t.Token == pg.Token_PARAM {
			if v, err := strconv.Atoi(n[t.Start+1 : t.End]); err == nil && v >= next {
				next = v + 1
			}
		}
	}
	var b strings.Builder
	b.Grow(len(n))
	last := 0
	afterComment := false // the next text starts after a removed comment
	write := func(s string) {
		if afterComment {
			s = strings.TrimLeft(s, " \t\r\n\f\v")
			if s == "" {
				return
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			afterComment = false
		}
		b.WriteString(s)
	}
	for i, t := range tokens {
		if !scrub[i] {
			continue
		}
		switch t.Token {
		case pg.Token_SQL_COMMENT, pg.Token_C_COMMENT:
			write(strings.TrimRight(n[last:t.Start], " \t\r\n\f\v"))
			afterComment = true
			last = int(t.End)
		case pg.Token_ASCII_45: // a number's sign: replaced with the number that follows it
			write(n[last:t.Start])
			last = int(tokens[i+1].Start)
		default:
			write(n[last:t.Start])
			write("$" + strconv.Itoa(next))
			next++
			last = int(t.End)
		}
	}
	write(n[last:])
	return strings.TrimSpace(b.String())
}

// typeKeyword reports the built-in type names that take a modifier in
// parentheses: numeric(10,2), varchar(20), timestamp(3), bit(8)...
func typeKeyword(t pg.Token) bool {
	switch t {
	case pg.Token_NUMERIC, pg.Token_DECIMAL_P, pg.Token_DEC, pg.Token_VARCHAR, pg.Token_CHAR_P,
		pg.Token_CHARACTER, pg.Token_VARYING, pg.Token_NCHAR, pg.Token_BIT, pg.Token_FLOAT_P,
		pg.Token_TIME, pg.Token_TIMESTAMP, pg.Token_INTERVAL:
		return true
	}
	return false
}

func inTypmod(stack []bool) bool { return len(stack) > 0 && stack[len(stack)-1] }
