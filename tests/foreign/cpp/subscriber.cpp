// Proton C++ subscriber for the foreign-client tests: a receiver link named --link from --topic
// (source timeout --expiry seconds, -1: expiry-policy never), reporting every delivery (its tag,
// the message id and body size) as JSON lines (--report) before it accepts it. Proton's reconnect
// brings the connection back (to the next URL of --url if the first is gone) and attaches the
// receiver again under the same container id and link name: the same subscription, resumed.
// Proton C++ has no receiver-settle-mode second: accept() settles at once (mode first). With
// --drain it grants no credit window: every 200 ms it grants --credit and drains (a pull consumer).
#include "common.hpp"

#include <proton/connection.hpp>
#include <proton/container.hpp>
#include <proton/delivery.hpp>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/receiver.hpp>
#include <proton/receiver_options.hpp>
#include <proton/source.hpp>
#include <proton/source_options.hpp>
#include <proton/transport.hpp>
#include <proton/work_queue.hpp>

class subscriber : public proton::messaging_handler {
  public:
    explicit subscriber(const foreign::args& a)
        : a_(a), rep_(a.get("report")), topic_(a.get("topic")), link_(a.get("link")),
          expiry_(a.num("expiry", 600)), credit_(a.num("credit", 100)), drain_(a.flag("drain")) {}

    void on_container_start(proton::container& c) override {
        c.connect(foreign::split(a_.get("url"), ',').at(0), foreign::connection_options(a_, a_.get("container")));
    }

    void on_connection_open(proton::connection& conn) override {
        std::string router;
        auto props = conn.properties();
        auto it = props.find(proton::symbol("oncemesh.router"));
        if (it != props.end()) router = proton::get<std::string>(it->second);
        rep_.line("connected", "\"reconnected\":" + std::string(conn.reconnected() ? "true" : "false") +
                                   ",\"router\":" + foreign::json_str(router));
        // On a reconnect Proton attaches the receiver again by itself, with the same name and
        // source: the same subscription resumes.
        if (!receiver_) {
            proton::source_options so;
            so.address(topic_).durability_mode(proton::source::UNSETTLED_STATE);
            if (expiry_ < 0) so.expiry_policy(proton::source::NEVER);
            else so.expiry_policy(proton::source::LINK_CLOSE).timeout(proton::duration(expiry_ * 1000));
            proton::receiver_options ro;
            ro.name(link_).auto_accept(false).source(so).credit_window(drain_ ? 0 : credit_);
            receiver_ = conn.open_receiver(topic_, ro);
        }
    }

    void on_receiver_open(proton::receiver& r) override {
        rep_.line("attached", "\"timeout\":" + std::to_string(r.source().timeout().milliseconds() / 1000));
        if (drain_ && !ticking_) {
            ticking_ = true;
            tick();
        }
    }

    void on_receiver_drain_finish(proton::receiver& r) override {
        rep_.line("drained", "\"credit\":" + std::to_string(r.credit()));
    }

    void on_message(proton::delivery& d, proton::message& m) override {
        std::string body = proton::get<std::string>(m.body());
        proton::binary tag = d.tag();
        std::string key = body.substr(0, body.find(';'));
        rep_.line("msg", "\"tag\":" + foreign::json_str(std::string(tag.begin(), tag.end())) +
                             ",\"id\":" + foreign::json_str(proton::to_string(m.id())) +
                             ",\"key\":" + foreign::json_str(key) + ",\"size\":" + std::to_string(body.size()));
        d.accept();
    }

    void on_transport_error(proton::transport& t) override {
        rep_.line("disconnected", "\"error\":" + foreign::json_str(t.error().what()));
    }
    void on_receiver_error(proton::receiver& r) override {
        rep_.line("link_error", "\"error\":" + foreign::json_str(r.error().what()));
    }
    void on_error(const proton::error_condition& e) override {
        rep_.line("error", "\"error\":" + foreign::json_str(e.what()));
    }

  private:
    // every 200 ms: once the credit is used up (by messages, or returned by the router's answer
    // to the drain), grant --credit again and drain
    void tick() {
        if (receiver_.active() && receiver_.credit() == 0) {
            receiver_.add_credit(credit_);
            receiver_.drain();
        }
        receiver_.container().schedule(proton::duration(200), [this]() { tick(); });
    }

    foreign::args a_;
    foreign::report rep_;
    std::string topic_, link_;
    long expiry_, credit_;
    bool drain_;
    bool ticking_ = false;
    proton::receiver receiver_;
};

int main(int argc, char** argv) {
    foreign::args a(argc, argv);
    subscriber h(a);
    try {
        proton::container(h, a.get("container")).run();
    } catch (const std::exception& e) {
        std::cerr << "subscriber: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
