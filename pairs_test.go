// SPDX-License-Identifier: MIT

package airlock

import (
	"fmt"
	"go/ast"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Per-family field pairs (issue 35, "X/X6 field pairs: 0 outside the wire
// shim and the aliases"). A struct that holds an address, a prefix or a
// piece of state once for IPv4 (X) and again for IPv6 (X6) makes every
// reader handle the two families apart, and makes the IPv4 one primary:
// keep a list of either family, or an array indexed by ipfamily.Family.
// Only the forms earlier releases wrote may still name a field per
// family: the version-1 lease on the wire, and the lease history's
// records before lists, which this release still reads. (The deprecated
// per-family flags are the other exception the issue allows: they sit in
// cmd/airlock's addrFlags.alias, beside no field of their own base name.)
var pairAllowed = map[string]string{
	"internal/control.leaseV1":         "the version-1 lease on the wire (leasewire.go), for clients and gateways of earlier releases",
	"internal/store.legacyLeaseRecord": "a lease history record as gateways before lists stored it (leases.go), read from their state",
}

// fieldPairs returns the structs of the module's non-test code with
// fields X and X6 (or x and x6), as "path:line Type: X/X6", and the keys
// of pairAllowed it saw such a pair in. Anonymous structs are named by
// the declaration they are in. Not walked: test files, third_party,
// testdata.
func fieldPairs(t *testing.T) (pairs []string, allowed map[string]bool) {
	t.Helper()
	allowed = map[string]bool{}
	walkGoFiles(t, nil, func(fset *token.FileSet, p string, f *ast.File) {
		for _, decl := range f.Decls {
			name := declName(decl)
			ast.Inspect(decl, func(n ast.Node) bool {
				if ts, ok := n.(*ast.TypeSpec); ok {
					name = ts.Name.Name
				}
				st, ok := n.(*ast.StructType)
				if !ok {
					return true
				}
				found := pairsIn(st)
				key := filepath.ToSlash(filepath.Dir(p)) + "." + name
				if _, ok := pairAllowed[key]; ok {
					allowed[key] = allowed[key] || len(found) > 0
					return true
				}
				for _, pair := range found {
					pairs = append(pairs, fmt.Sprintf("%s:%d %s: %s", p, fset.Position(st.Pos()).Line, name, pair))
				}
				return true
			})
		}
	})
	sort.Strings(pairs)
	return pairs, allowed
}

// declName names a top-level declaration: a function (Type.Method for a
// method), a type, or the first name of a var or const.
func declName(decl ast.Decl) string {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		return funcName(d)
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				return s.Name.Name
			case *ast.ValueSpec:
				return s.Names[0].Name
			}
		}
	}
	return "?"
}

// pairsIn returns st's field pairs as "X/X6".
func pairsIn(st *ast.StructType) []string {
	names := map[string]bool{}
	for _, f := range st.Fields.List {
		for _, n := range f.Names {
			names[n.Name] = true
		}
		if len(f.Names) == 0 { // embedded: named by its type
			typ := f.Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if sel, ok := typ.(*ast.SelectorExpr); ok {
				typ = sel.Sel
			}
			if id, ok := typ.(*ast.Ident); ok {
				names[id.Name] = true
			}
		}
	}
	var out []string
	for n := range names {
		if base, ok := strings.CutSuffix(n, "6"); ok && base != "" && names[base] {
			out = append(out, base+"/"+n)
		}
	}
	sort.Strings(out)
	return out
}

// TestFieldPairs fails when a struct outside pairAllowed has fields X and
// X6, and lists them; and when pairAllowed names a type without a pair.
func TestFieldPairs(t *testing.T) {
	pairs, allowed := fieldPairs(t)
	if len(pairs) > 0 {
		t.Errorf("%d per-family field pairs X/X6: keep a list of either family (IPv4 first), or an array indexed by ipfamily.Family; only the version-1 wire shim (pairAllowed) may name a field per family.\n%s",
			len(pairs), strings.Join(pairs, "\n"))
	}
	for key := range pairAllowed {
		if !allowed[key] {
			t.Errorf("pairAllowed names %s, which has no X/X6 field pair or does not exist: remove it", key)
		}
	}
}
