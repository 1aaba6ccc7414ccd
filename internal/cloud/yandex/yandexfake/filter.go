package yandexfake

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
)

// maxFilterLen is the API's limit on a filter's length.
const maxFilterLen = 1000

// condition is one `<field> <operator> <values>` of a filter.
type condition struct {
	label  string // the label key for a labels.<key> field; "" for name
	negate bool
	values []string
}

func (c condition) match(d *compute.Disk) bool {
	var have string
	var ok bool
	if c.label == "" {
		have, ok = d.GetName(), true
	} else {
		have, ok = d.GetLabels()[c.label]
	}
	in := ok && slices.Contains(c.values, have)
	return in != c.negate
}

// parseFilter parses the subset of the API's filter syntax the fake
// knows: conditions joined by AND, each `name` or `labels.<key>`, then `=`,
// `!=`, `IN` or `NOT IN`, then a quoted string or, for IN, a parenthesised
// list of them. It returns the predicate of a disk.
func parseFilter(s string) (func(*compute.Disk) bool, error) {
	if len(s) > maxFilterLen {
		return nil, fmt.Errorf("longer than %d", maxFilterLen)
	}
	p := &filterParser{s: s}
	var conds []condition
	for {
		p.space()
		if p.eof() {
			if len(conds) > 0 {
				return nil, errors.New("AND without a condition after it")
			}
			break
		}
		c, err := p.condition()
		if err != nil {
			return nil, err
		}
		conds = append(conds, c)
		p.space()
		if p.eof() {
			break
		}
		if !p.keyword("AND") {
			return nil, fmt.Errorf("at %d: want AND", p.i)
		}
	}
	return func(d *compute.Disk) bool {
		for _, c := range conds {
			if !c.match(d) {
				return false
			}
		}
		return true
	}, nil
}

type filterParser struct {
	s string
	i int
}

func (p *filterParser) eof() bool { return p.i >= len(p.s) }

func (p *filterParser) space() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n') {
		p.i++
	}
}

// keyword consumes kw (case-insensitive) followed by a space or a
// parenthesis.
func (p *filterParser) keyword(kw string) bool {
	end := p.i + len(kw)
	if end > len(p.s) || !strings.EqualFold(p.s[p.i:end], kw) {
		return false
	}
	if end < len(p.s) && p.s[end] != ' ' && p.s[end] != '(' && p.s[end] != '\t' {
		return false
	}
	p.i = end
	return true
}

func isFieldChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_.-/@\\", c) >= 0
}

func (p *filterParser) condition() (condition, error) {
	start := p.i
	for !p.eof() && isFieldChar(p.s[p.i]) {
		p.i++
	}
	field := p.s[start:p.i]
	var c condition
	switch {
	case field == "name":
	case strings.HasPrefix(field, "labels.") && labelKeyRE.MatchString(field[len("labels."):]):
		c.label = field[len("labels."):]
	default:
		return c, fmt.Errorf("at %d: field %q is not one this fake filters on (name, labels.<key>)", start, field)
	}
	p.space()
	list := false
	switch {
	case strings.HasPrefix(p.s[p.i:], "!="):
		p.i += 2
		c.negate = true
	case strings.HasPrefix(p.s[p.i:], "="):
		p.i++
	case p.keyword("IN"):
		list = true
	case p.keyword("NOT"):
		p.space()
		if !p.keyword("IN") {
			return c, fmt.Errorf("at %d: want IN after NOT", p.i)
		}
		c.negate, list = true, true
	default:
		return c, fmt.Errorf("at %d: want =, !=, IN or NOT IN", p.i)
	}
	p.space()
	var err error
	if list {
		c.values, err = p.list()
	} else {
		var v string
		v, err = p.str()
		c.values = []string{v}
	}
	return c, err
}

func (p *filterParser) list() ([]string, error) {
	if p.eof() || p.s[p.i] != '(' {
		return nil, fmt.Errorf("at %d: want (", p.i)
	}
	p.i++
	var out []string
	for {
		p.space()
		v, err := p.str()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		p.space()
		if p.eof() {
			return nil, errors.New("unterminated list")
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ')':
			p.i++
			return out, nil
		default:
			return nil, fmt.Errorf("at %d: want , or )", p.i)
		}
	}
}

// str parses a quoted string with C-style escapes of the quote and the
// backslash.
func (p *filterParser) str() (string, error) {
	if p.eof() || (p.s[p.i] != '"' && p.s[p.i] != '\'') {
		return "", fmt.Errorf("at %d: want a quoted string", p.i)
	}
	q := p.s[p.i]
	p.i++
	var b strings.Builder
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == q:
			return b.String(), nil
		case c == '\\':
			if p.eof() {
				return "", errors.New("unterminated string")
			}
			e := p.s[p.i]
			p.i++
			if e != '"' && e != '\'' && e != '\\' {
				return "", fmt.Errorf("at %d: escape \\%c is not one this fake knows", p.i-2, e)
			}
			b.WriteByte(e)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("unterminated string")
}
