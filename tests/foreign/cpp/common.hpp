// Shared by the Proton C++ publisher and subscriber of the foreign-client tests
// (tests/foreign/README in docs/clients.md): argument parsing, the JSON-lines report, connection
// options (failover list, SASL PLAIN, TLS). Written for these tests; no oncemesh code or extension.
#pragma once

#include <proton/binary.hpp>
#include <proton/connection_options.hpp>
#include <proton/reconnect_options.hpp>
#include <proton/ssl.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace foreign {

struct args {
    std::map<std::string, std::string> kv;

    args(int argc, char** argv) {
        for (int i = 1; i < argc; ++i) {
            std::string k = argv[i];
            if (k.rfind("--", 0) != 0) usage("unexpected argument " + k);
            k = k.substr(2);
            if (k == "second" || k == "drain") { kv[k] = "1"; continue; }  // flags
            if (i + 1 >= argc) usage("--" + k + " needs a value");
            kv[k] = argv[++i];
        }
    }
    [[noreturn]] static void usage(const std::string& why) {
        std::cerr << "error: " << why << "\n";
        std::exit(2);
    }
    std::string get(const std::string& k, const std::string& dflt = "\x01") const {
        auto it = kv.find(k);
        if (it != kv.end()) return it->second;
        if (dflt == "\x01") usage("--" + k + " is required");
        return dflt;
    }
    long num(const std::string& k, long dflt) const { return std::stol(get(k, std::to_string(dflt))); }
    bool flag(const std::string& k) const { return kv.count(k) > 0; }
};

inline std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, sep))
        if (!item.empty()) out.push_back(item);
    return out;
}

inline std::string hex(const proton::binary& b) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : b) { out += digits[c >> 4]; out += digits[c & 15]; }
    return out;
}

inline std::string json_str(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
        else if (c < 0x20 || c > 0x7e) { char buf[8]; std::snprintf(buf, sizeof buf, "\\u%04x", c); out += buf; }
        else out += static_cast<char>(c);
    }
    return out + "\"";
}

// One JSON object per line, flushed at once: the test reads the file while the client runs, and a
// SIGKILLed client must leave every line it wrote.
class report {
  public:
    explicit report(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {
        if (!f_) args::usage("cannot open report " + path);
    }
    void line(const std::string& ev, const std::string& fields = "") {
        double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        std::fprintf(f_, "{\"ev\":\"%s\",\"ts\":%.6f%s%s}\n", ev.c_str(), ts, fields.empty() ? "" : ",", fields.c_str());
        std::fflush(f_);
    }
  private:
    std::FILE* f_;
};

// The URL list is the failover list: Proton C++ connects to the first and, on a lost connection,
// tries the others in turn (reconnect_options::failover_urls), then the first again.
inline proton::connection_options connection_options(const args& a, const std::string& container_id) {
    proton::connection_options co;
    co.container_id(container_id);
    std::vector<std::string> urls = split(a.get("url"), ',');
    std::vector<std::string> rest(urls.begin() + 1, urls.end());
    co.reconnect(proton::reconnect_options().delay(proton::duration(100)).max_delay(proton::duration(1000)));
    co.failover_urls(rest);
    co.idle_timeout(proton::duration(2000));
    if (a.flag("user")) {
        co.user(a.get("user"));
        co.password(a.get("password"));
        co.sasl_enabled(true);
        co.sasl_allowed_mechs("PLAIN");
    }
    if (a.flag("ca")) {
        co.ssl_client_options(proton::ssl_client_options(a.get("ca"), proton::ssl::VERIFY_PEER_NAME));
    }
    return co;
}

}  // namespace foreign
