// SPDX-License-Identifier: MIT

package envfile

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `# comment
; also a comment

AIRLOCK_GATEWAY_LISTEN=10.1.0.5:8443
  SPACED = value with spaces  
DQ="a \"b\" c"
SQ='x\y'
EMPTY=
CONT=one \
two
LATER=1
LATER=2
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"AIRLOCK_GATEWAY_LISTEN": "10.1.0.5:8443", "SPACED": "value with spaces", "DQ": `a "b" c`,
		"SQ": `x\y`, "EMPTY": "", "CONT": "one two", "LATER": "2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"NOEQUALS\n", "1X=a\n", "A-B=c\n", "Q=\"open\n", "=v\n"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}
