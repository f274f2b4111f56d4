// Proton C++ publisher for the foreign-client tests: sends --count messages to --topic on a sender
// link named --link, at most --window unsettled, and reports every transfer and outcome as JSON
// lines (--report). What is in doubt when the connection drops (sent, no outcome) is sent again,
// with the same delivery tag, once Proton's reconnect has brought the connection back (to the next
// URL of --url if the first is gone): the message identity oncemesh recognises
// (docs/wire-protocol.md, "Publishing"). Tags are the message numbers in decimal ASCII. --rate
// caps new messages per second (0: as fast as credit allows), so that a test can act mid-stream.
#include "common.hpp"

#include <proton/connection.hpp>
#include <proton/container.hpp>
#include <proton/delivery_mode.hpp>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/sender.hpp>
#include <proton/sender_options.hpp>
#include <proton/target_options.hpp>
#include <proton/tracker.hpp>
#include <proton/transport.hpp>

#include <proton/work_queue.hpp>

#include <chrono>
#include <deque>
#include <map>

class publisher : public proton::messaging_handler {
  public:
    explicit publisher(const foreign::args& a)
        : a_(a), rep_(a.get("report")), topic_(a.get("topic")), link_(a.get("link")),
          count_(a.num("count", 100)), window_(a.num("window", 50)), size_(a.num("size", 0)),
          rate_(a.num("rate", 0)), start_(std::chrono::steady_clock::now()) {}

    void on_container_start(proton::container& c) override {
        c.connect(foreign::split(a_.get("url"), ',').at(0), foreign::connection_options(a_, a_.get("container")));
    }

    void on_connection_open(proton::connection& conn) override {
        rep_.line("connected", "\"reconnected\":" + std::string(conn.reconnected() ? "true" : "false"));
        if (conn.reconnected()) {
            // What was unsettled on the lost connection is in doubt: send it again under its tag.
            // Proton forgets those deliveries on the new connection by itself; settling them here
            // would make it send each one again as an empty pre-settled transfer.
            for (auto& kt : unsettled_) resend_.push_back(kt.first);
            unsettled_.clear();
        }
        // On a reconnect Proton attaches the links of the connection again by itself (same names):
        // opening another one here would attach the name twice (a session error).
        if (!sender_) {
            proton::sender_options so;
            so.name(link_).delivery_mode(proton::delivery_mode::AT_LEAST_ONCE);
            sender_ = conn.open_sender(topic_, so);
        }
    }

    void on_sender_open(proton::sender&) override {
        rep_.line("attached");
        up_ = true;
    }

    void on_sendable(proton::sender& s) override {
        // Only while the link is attached on a live connection: Proton keeps a lost link's credit
        // and sends what was sent meanwhile by itself first on the next link, where our resend of
        // the same tag (in doubt) would be a second transfer under a tag still open: AMQP forbids
        // it, and a router takes it for another message (docs/clients.md, reused tags).
        if (!up_) return;
        while (s.credit() > 0 && static_cast<long>(unsettled_.size()) < window_) {
            long k;
            bool again = !resend_.empty();
            if (again) {
                k = resend_.front();
                resend_.pop_front();
                if (outcome_.count(k)) continue;
            } else if (next_ < count_ && next_ < allowed()) {
                k = next_++;
            } else {
                if (next_ < count_ && !wakeup_) {  // paced: come back in 10 ms
                    wakeup_ = true;
                    s.container().schedule(proton::duration(10), [this]() {
                        wakeup_ = false;
                        if (sender_.active()) on_sendable(sender_);
                    });
                }
                break;
            }
            proton::message m;
            std::string id = link_ + ":" + std::to_string(k);
            std::string body = id + ";";
            if (body.size() < size_) body += std::string(size_ - body.size(), 'x');
            m.id(proton::message_id(id));
            m.body(body);
            m.durable(true);
            // Our own tags, unique per link name: Proton C++ 0.37's default tag is a counter kept in
            // the `sender` wrapper object, and each event hands out a new wrapper, so the default
            // restarts at 1 (seen: tag 1 sent again while the first tag 1 was in flight).
            if (!again) tag_of_[k] = proton::binary(std::to_string(k));
            proton::tracker t = sender_.send(m, tag_of_.at(k));
            unsettled_[k] = t;
            k_of_[foreign::hex(t.tag())] = k;
            rep_.line("sent", "\"k\":" + std::to_string(k) + ",\"tag\":\"" + foreign::hex(t.tag()) +
                                  "\",\"resend\":" + (again ? "true" : "false"));
        }
    }

    void on_tracker_accept(proton::tracker& t) override { outcome(t, "ACCEPTED"); }
    void on_tracker_reject(proton::tracker& t) override { outcome(t, "REJECTED"); }
    void on_tracker_release(proton::tracker& t) override { outcome(t, "RELEASED"); }

    void on_transport_error(proton::transport& t) override {
        up_ = false;
        rep_.line("disconnected", "\"error\":" + foreign::json_str(t.error().what()));
    }
    void on_sender_error(proton::sender& s) override {
        rep_.line("link_error", "\"error\":" + foreign::json_str(s.error().what()));
    }
    void on_connection_error(proton::connection& c) override {
        rep_.line("error", "\"error\":" + foreign::json_str(c.error().what()));
    }
    void on_error(const proton::error_condition& e) override {
        rep_.line("error", "\"error\":" + foreign::json_str(e.what()));
    }

  private:
    long allowed() const {
        if (rate_ <= 0) return count_;
        double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        return static_cast<long>(t * rate_) + 1;
    }

    void outcome(proton::tracker& t, const char* what) {
        auto it = k_of_.find(foreign::hex(t.tag()));
        if (it == k_of_.end()) return;
        long k = it->second;
        if (unsettled_.count(k) && unsettled_[k] == t) unsettled_.erase(k);
        else return;  // a delivery of an earlier connection (already resent)
        if (!t.settled()) t.settle();
        if (std::string(what) == "RELEASED") {  // "try again": same tag
            resend_.push_back(k);
        } else {
            outcome_[k] = what;
            rep_.line("outcome", "\"k\":" + std::to_string(k) + ",\"tag\":\"" + foreign::hex(t.tag()) +
                                     "\",\"outcome\":\"" + what + "\"");
        }
        if (static_cast<long>(outcome_.size()) == count_) {
            rep_.line("done");
            t.connection().close();
            return;
        }
        proton::sender s = t.sender();
        on_sendable(s);
    }

    foreign::args a_;
    foreign::report rep_;
    std::string topic_, link_;
    long count_, window_;
    size_t size_;
    long rate_;
    std::chrono::steady_clock::time_point start_;
    bool wakeup_ = false;
    bool up_ = false;
    long next_ = 0;
    proton::sender sender_;
    std::map<long, proton::binary> tag_of_;
    std::map<std::string, long> k_of_;
    std::map<long, proton::tracker> unsettled_;
    std::map<long, std::string> outcome_;
    std::deque<long> resend_;
};

int main(int argc, char** argv) {
    foreign::args a(argc, argv);
    publisher h(a);
    try {
        proton::container(h, a.get("container")).run();
    } catch (const std::exception& e) {
        std::cerr << "publisher: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
