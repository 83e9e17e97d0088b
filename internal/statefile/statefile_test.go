// SPDX-License-Identifier: MIT

package statefile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteAtomic: the file has the data and mode asked for, a second write
// replaces it whole, and no temporary file is left beside it.
func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "join.env")
	if ok, err := Exists(path); ok || err != nil {
		t.Fatalf("Exists before the write: %v, %v; want false, nil", ok, err)
	}
	for _, data := range []string{"first\n", "second, longer\n"} {
		if err := WriteAtomic(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Errorf("read back %q, %v; want %q", got, err, data)
		}
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d entries in the directory, want the file alone (a temporary file left?)", len(entries))
	}
	if ok, err := Exists(path); !ok || err != nil {
		t.Errorf("Exists after the write: %v, %v; want true, nil", ok, err)
	}
	if err := WriteAtomic(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
}
