package yandexfake

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"time"
)

// Metadata service paths (the GCE-compatible API Yandex serves at
// http://169.254.169.254).
const (
	MetadataIDPath    = "/computeMetadata/v1/instance/id"
	MetadataZonePath  = "/computeMetadata/v1/instance/zone"
	MetadataTokenPath = "/computeMetadata/v1/instance/service-accounts/default/token"
)

// MetadataServer starts an HTTP server that answers as the metadata service
// of instance instanceID in zone, of folder folder: its id, its zone (as
// "projects/<folder>/zones/<zone>"), and an IAM token of its service
// account (JSON access_token, expires_in, token_type) that the fake
// accepts. Requests without the header "Metadata-Flavor: Google" are
// refused (403), as the real service does; unknown paths are 404. Close it
// when done (Fake.Close also closes it).
func (f *Fake) MetadataServer(instanceID, zone, folder string) *httptest.Server {
	mux := http.NewServeMux()
	text := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/text")
			_, _ = w.Write([]byte(body))
		}
	}
	mux.Handle("GET "+MetadataIDPath, text(instanceID))
	mux.Handle("GET "+MetadataZonePath, text("projects/"+folder+"/zones/"+zone))
	mux.HandleFunc("GET "+MetadataTokenPath, func(w http.ResponseWriter, _ *http.Request) {
		token, expires, err := f.issueToken()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"access_token": token,
			"expires_in":   int64(time.Until(expires) / time.Second),
			"token_type":   "Bearer",
		})
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	f.mu.Lock()
	f.metadata = append(f.metadata, srv)
	f.mu.Unlock()
	return srv
}
