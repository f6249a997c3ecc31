package harness

import (
	"fmt"
	"os"
	"testing"
)

func TestReadListeners(t *testing.T) {
	// Scenario: kafka.sh's listeners file gives each client listener's ports per node, in node order; a line of the wrong shape is an error.
	path := t.TempDir() + "/listeners"
	if err := os.WriteFile(path, []byte("1 CLIENT1 10001 10002\n1 CLIENT2 10003 10004\n2 CLIENT1 10005 10006\n2 CLIENT2 10007 10008\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readListeners(path, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]ClientListener{
		{{1, "CLIENT1", 10001, 10002}, {2, "CLIENT1", 10005, 10006}},
		{{1, "CLIENT2", 10003, 10004}, {2, "CLIENT2", 10007, 10008}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("readListeners = %v, want %v", got, want)
	}
	if got[1][0].AdvertisedAddr() != "127.0.0.1:10004" || got[1][0].ListenAddr() != "127.0.0.1:10003" {
		t.Errorf("node 1 CLIENT2 addresses = %s, %s", got[1][0].ListenAddr(), got[1][0].AdvertisedAddr())
	}
	if _, err := readListeners(path, 3, 2); err == nil {
		t.Error("a file with 2 nodes read as 3: no error")
	}
	if err := os.WriteFile(path, []byte("1 CLIENT1 10001\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readListeners(path, 1, 1); err == nil {
		t.Error("a line of 3 fields: no error")
	}
}
