package rules

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// ErrInvalid is wrapped by every [*Error]: errors.Is(err, ErrInvalid) tells a rejected
// rules file or config from an I/O error.
var ErrInvalid = errors.New("pgtraffic: invalid rules")

// Error is one problem in a rules file or a [Config].
//
// Its message names the line (for a parsed file) and the field path in rules-file spelling:
//
//	pgtraffic: rules line 7: budgets[1].max_concurent: unknown field
//	pgtraffic: rules: rules[0].budget: unknown budget "reporting"
type Error struct {
	Line  int    // 1-based line in the file; 0 for a Config built in code
	Field string // field path, e.g. "budgets[1].server_share"; empty for a syntax error
	Msg   string // what is wrong
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("pgtraffic: rules")
	if e.Line > 0 {
		b.WriteString(" line ")
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns [ErrInvalid].
func (e *Error) Unwrap() error { return ErrInvalid }

// maxErrors bounds a report: past it a file is more likely the wrong file than a draft.
const maxErrors = 20

// maxKept bounds the problems kept with their line and message, of which the report shows the
// first maxErrors by line: a file with more is the wrong file (a list of a million numbers),
// whose further problems are only counted, so that refusing it costs little more than reading it.
const maxKept = 1000

// problems collects errors. root is the decoded file (nil for a config built in code): checks
// made after decoding find the line of a field in it (see [field.find]), which costs nothing
// until a problem is found.
type problems struct {
	root    *yaml.Node
	errs    []*Error
	dropped int // problems past maxKept, counted only
}

func (p *problems) addLine(line int, at field, format string, args ...any) {
	if len(p.errs) == maxKept {
		p.dropped++
		return
	}
	p.errs = append(p.errs, &Error{Line: line, Field: at.String(), Msg: fmt.Sprintf(format, args...)})
}

// add reports a problem at field at, on the line of at or of its nearest written parent.
func (p *problems) add(at field, format string, args ...any) {
	if len(p.errs) == maxKept {
		p.dropped++
		return
	}
	p.addLine(p.line(at), at, format, args...)
}

func (p *problems) line(at field) int {
	for ; at.n > 0 && p.root != nil; at = at.parent() {
		if n, l := at.find(p.root); n != nil {
			return l
		}
	}
	return 0
}

// explicit reports whether the field of struct *s at address f, which is at at, was written in
// the file, with a value other than null (always false for a config built in code). It names
// the field only when there is a file to look in.
func (p *problems) explicit(at field, s, f any) bool {
	return p.root != nil && p.written(at.member(s, f)) != nil
}

// written returns the node written in the file at at: nil when at is omitted (absent or null)
// and for a config built in code.
func (p *problems) written(at field) *yaml.Node {
	if p.root == nil {
		return nil
	}
	n, _ := at.find(p.root)
	return n
}

// err returns nil, or every problem (by line, when there are lines) joined.
func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(p.errs, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	errs := make([]error, 0, min(len(p.errs), maxErrors+1))
	for i, e := range p.errs {
		if i == maxErrors {
			errs = append(errs, &Error{Msg: fmt.Sprintf("%d more problems not shown", len(p.errs)+p.dropped-maxErrors)})
			break
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// maxQuoted bounds the bytes of file text that one message quotes.
const maxQuoted = 32

// quoteShort quotes s, file text, for a message: cut to maxQuoted bytes with an ellipsis, and
// not at all when it may hold a credential (a URL, user@host, key=value), as a secret pasted on
// the wrong line would be.
func quoteShort(s string) string {
	if strings.Contains(s, "://") || strings.ContainsAny(s, "@=") {
		return "(a value not shown: it may hold a credential)"
	}
	if len(s) > maxQuoted {
		cut := maxQuoted
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "..."
	}
	return strconv.Quote(s)
}
