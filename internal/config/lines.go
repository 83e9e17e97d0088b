// SPDX-License-Identifier: MIT

package config

import (
	"fmt"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// lineIndex maps key paths ("policy.rule[2].to", array tables numbered
// from 1) to the line where the key (or table header) is.
type lineIndex map[string]int

// find returns the line of key, or of its nearest ancestor that has one,
// or 0.
func (l lineIndex) find(key string) int {
	for key != "" {
		if n, ok := l[key]; ok {
			return n
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// keyLines indexes the lines of every key of a document that go-toml has
// already decoded without error. It never fails: a key it cannot place has
// no entry.
func keyLines(data []byte) lineIndex {
	idx := lineIndex{}
	var p unstable.Parser
	p.Reset(data)
	arrays := map[string]int{}
	cur := ""
	line := func(n *unstable.Node) int {
		if n == nil || n.Raw.Length == 0 && n.Raw.Offset == 0 {
			return 0
		}
		return p.Shape(n.Raw).Start.Line
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			k, first := keyPath(e)
			if e.Kind == unstable.ArrayTable {
				arrays[k]++
				k = fmt.Sprintf("%s[%d]", k, arrays[k])
			}
			cur = k
			if _, ok := idx[k]; !ok {
				idx[k] = line(first)
			}
		case unstable.KeyValue:
			indexKeyValue(idx, cur, e, line)
		}
	}
	return idx
}

// keyPath joins the dotted key of a Table, ArrayTable or KeyValue node and
// returns its first key part.
func keyPath(n *unstable.Node) (string, *unstable.Node) {
	var parts []string
	var first *unstable.Node
	it := n.Key()
	for it.Next() {
		if first == nil {
			first = it.Node()
		}
		parts = append(parts, quoteKey(string(it.Node().Data)))
	}
	return strings.Join(parts, "."), first
}

func join(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// indexKeyValue records a key = value line, and the keys inside inline
// tables and arrays of inline tables in its value.
func indexKeyValue(idx lineIndex, prefix string, kv *unstable.Node, line func(*unstable.Node) int) {
	k, first := keyPath(kv)
	path := join(prefix, k)
	idx[path] = line(first)
	indexValue(idx, path, kv.Value(), line, idx[path])
}

func indexValue(idx lineIndex, path string, v *unstable.Node, line func(*unstable.Node) int, at int) {
	switch v.Kind {
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			indexKeyValue(idx, path, it.Node(), line)
		}
	case unstable.Array:
		it := v.Children()
		i := 0
		for it.Next() {
			i++
			el := fmt.Sprintf("%s[%d]", path, i)
			if n := line(it.Node()); n > 0 {
				idx[el] = n
			} else {
				idx[el] = at
			}
			indexValue(idx, el, it.Node(), line, idx[el])
		}
	}
}
