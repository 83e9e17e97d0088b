// SPDX-License-Identifier: MIT

package airlock

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Long functions (issue 35, "functions over 60 lines"). A function that
// does not fit on a screen is read in pieces; splitting it into named
// steps says what the pieces are. maxLongFuncs is the count of functions
// over maxFuncLines today: the test fails when it grows, so the count can
// only go down. When a change brings it down, lower maxLongFuncs to the
// new count (the test's log says when).
const (
	maxFuncLines = 60
	maxLongFuncs = 24
)

// longFuncs returns the functions and methods of the module's production
// code longer than maxFuncLines lines, from "func" to the closing brace,
// as "LINES path:line name". Not counted: test files, third_party, the
// test topology and benchmark harness (test/, bench/), and test doubles
// (packages named *test, like forwardtest).
func longFuncs(t *testing.T) []string {
	t.Helper()
	var out []string
	skip := func(p string, d fs.DirEntry) bool {
		return p == "test" || p == "bench" || p == "dist" || p != "." && strings.HasSuffix(d.Name(), "test")
	}
	walkGoFiles(t, skip, func(fset *token.FileSet, p string, f *ast.File) {
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			if n := end.Line - start.Line + 1; n > maxFuncLines {
				out = append(out, fmt.Sprintf("%4d %s:%d %s", n, p, start.Line, funcName(fd)))
			}
		}
	})
	sort.Strings(out)
	return out
}

// walkGoFiles parses the module's non-test Go files and calls fn with
// each. It skips .git, third_party, testdata and the directories skip
// names (nil: none).
func walkGoFiles(t *testing.T, skip func(path string, d fs.DirEntry) bool, fn func(fset *token.FileSet, path string, f *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == ".git" || p == "third_party" || d.Name() == "testdata" || skip != nil && skip(p, d) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		fn(fset, p, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// funcName is fd's name, Type.Method for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// TestLongFunctions fails when more functions than maxLongFuncs are
// longer than maxFuncLines lines, and lists them.
func TestLongFunctions(t *testing.T) {
	long := longFuncs(t)
	list := strings.Join(long, "\n")
	switch {
	case len(long) > maxLongFuncs:
		t.Errorf("%d functions are longer than %d lines, want at most %d: split the one you made longer into named steps.\n%s",
			len(long), maxFuncLines, maxLongFuncs, list)
	case len(long) < maxLongFuncs:
		t.Logf("%d functions are longer than %d lines, %d fewer than maxLongFuncs: lower maxLongFuncs to %d.\n%s",
			len(long), maxFuncLines, maxLongFuncs-len(long), len(long), list)
	}
}
