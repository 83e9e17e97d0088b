// SPDX-License-Identifier: MIT

package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestNewLoggerFormat(t *testing.T) {
	var b strings.Builder
	log, err := newLoggerFormat(&b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("job joined", "job", "42\n\x1b[31m", "uid", 1000)
	log.Debug("hidden")
	var rec map[string]any
	if err := json.Unmarshal([]byte(b.String()), &rec); err != nil {
		t.Fatalf("json log line %q: %v", b.String(), err)
	}
	if rec["msg"] != "job joined" || rec["level"] != "INFO" || rec["job"] != "42\n\x1b[31m" || rec["uid"] != 1000.0 || rec["time"] == nil {
		t.Errorf("got %v", rec)
	}
	if strings.Count(b.String(), "\n") != 1 {
		t.Errorf("want one line (debug filtered, newline escaped), got %q", b.String())
	}
	b.Reset()
	log, err = newLoggerFormat(&b, "warn", "text")
	if err != nil {
		t.Fatal(err)
	}
	log.Warn("x", "k", "v")
	if !strings.Contains(b.String(), "level=WARN msg=x k=v") {
		t.Errorf("text: got %q", b.String())
	}
	for _, tc := range [][2]string{{"info", "xml"}, {"loud", "json"}} {
		if _, err := newLoggerFormat(&b, tc[0], tc[1]); err == nil {
			t.Errorf("level %q format %q: no error", tc[0], tc[1])
		}
	}
}
