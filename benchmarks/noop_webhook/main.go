// A mutating webhook that does next to nothing: it adds one label to every pod it is sent (a JSON patch, as
// raygate's pod gate answers), over TLS and HTTP/1.1 as raygate's webhook is served. The podgate benchmark
// times the API server calling it beside raygate's webhook: what any webhook call costs the API server,
// whatever answers it. The pods it is sent must have labels.
//
// Usage: noop-webhook <listen address> <tls.crt> <tls.key>
package main

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"os"
)

const labelPatch = `[{"op":"add","path":"/metadata/labels/bench.raygate.io~1noop","value":"seen"}]`

type request struct {
	UID string `json:"uid"`
}

type review struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Request    *request        `json:"request,omitempty"`
	Response   *reviewResponse `json:"response,omitempty"`
}

type reviewResponse struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType"`
	Patch     []byte `json:"patch"`
}

func mutate(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var in review
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil || in.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	out, _ := json.Marshal(review{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview",
		Response: &reviewResponse{UID: in.Request.UID, Allowed: true, PatchType: "JSONPatch", Patch: []byte(labelPatch)}})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func main() {
	if len(os.Args) != 4 {
		log.Fatal("usage: noop-webhook <listen address> <tls.crt> <tls.key>")
	}
	http.HandleFunc("/mutate", mutate)
	srv := &http.Server{Addr: os.Args[1],
		// HTTP/1.1 only, as gunicorn serves raygate's webhook.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	log.Fatal(srv.ListenAndServeTLS(os.Args[2], os.Args[3]))
}
