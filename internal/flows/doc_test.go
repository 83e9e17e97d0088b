// SPDX-License-Identifier: MIT

package flows

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestDocsListEveryField compares the fields a flow record can hold
// (Record's JSON names, its embedded jobs.Ref's and DNSInfo's) with the
// field table of docs/flows.md, both ways: a field the code writes is
// documented, and a documented field exists.
func TestDocsListEveryField(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "flows.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Fields")
	if start < 0 {
		t.Fatal(`docs/flows.md has no "## Fields" section`)
	}
	section := doc[start:]
	if end := strings.Index(section[len("## Fields"):], "\n## "); end >= 0 {
		section = section[:len("## Fields")+end]
	}
	documented := map[string]bool{}
	row := regexp.MustCompile("(?m)^\\| (`[^|]+) \\|")
	name := regexp.MustCompile("`([a-z_]+)`")
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		for _, n := range name.FindAllStringSubmatch(m[1], -1) {
			documented[n[1]] = true
		}
	}
	dnsLine := ""
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "| `dns`") {
			dnsLine = l
		}
	}
	written := jsonNames(reflect.TypeOf(Record{}))
	for _, n := range written {
		if !documented[n] {
			t.Errorf("the flow log writes %q; docs/flows.md's field table lacks it", n)
		}
		delete(documented, n)
	}
	for n := range documented {
		t.Errorf("docs/flows.md documents %q; flows.Record has no such field", n)
	}
	for _, n := range jsonNames(reflect.TypeOf(DNSInfo{})) {
		if !strings.Contains(dnsLine, "`"+n+"`") {
			t.Errorf("docs/flows.md's dns row does not name its field %q", n)
		}
	}
}

// jsonNames lists the JSON names of t's fields, embedded structs' fields
// inline.
func jsonNames(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && tag == "" {
			out = append(out, jsonNames(f.Type)...)
			continue
		}
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		out = append(out, tag)
	}
	return out
}
