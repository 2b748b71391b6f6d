#include "obs/metrics.h"

#include <algorithm>
#include <sstream>

namespace armada::obs {

void Gauge::add(double d) {
    double cur = v_.load(std::memory_order_relaxed);
    while (!v_.compare_exchange_weak(cur, cur + d, std::memory_order_relaxed)) {
    }
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
    const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
    std::lock_guard lk(mu_);
    counts_[i]++;
    sum_ += v;
    count_++;
}

void Histogram::snapshot(std::vector<uint64_t> & buckets, double & sum, uint64_t & count) const {
    std::lock_guard lk(mu_);
    buckets = counts_;
    sum = sum_;
    count = count_;
}

namespace {
std::string escape(const std::string & s) {
    std::string out;
    for (char c : s) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

std::string fmt(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}
}  // namespace

std::string format_labels(const Labels & labels) {
    if (labels.empty()) return {};
    std::string s = "{";
    for (size_t i = 0; i < labels.size(); ++i) {
        if (i) s += ',';
        s += labels[i].first + "=\"" + escape(labels[i].second) + "\"";
    }
    return s + "}";
}

std::vector<double> latency_buckets() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

Registry::Family & Registry::family(const std::string & name, const char * type, const std::string & help) {
    auto & f = families_[name];
    if (f.type.empty()) {
        f.type = type;
        f.help = help;
    }
    return f;
}

void Registry::erase_families(const std::string & prefix) {
    std::lock_guard lk(mu_);
    std::erase_if(families_, [&](const auto & f) { return f.first.rfind(prefix, 0) == 0; });
}

Counter & Registry::counter(const std::string & name, const std::string & help, const Labels & labels) {
    std::lock_guard lk(mu_);
    auto & slot = family(name, "counter", help).counters[format_labels(labels)];
    if (!slot) slot = std::make_unique<Counter>();
    return *slot;
}

Gauge & Registry::gauge(const std::string & name, const std::string & help, const Labels & labels) {
    std::lock_guard lk(mu_);
    auto & slot = family(name, "gauge", help).gauges[format_labels(labels)];
    if (!slot) slot = std::make_unique<Gauge>();
    return *slot;
}

Histogram & Registry::histogram(const std::string & name, const std::string & help, const std::vector<double> & bounds,
                                const Labels & labels) {
    std::lock_guard lk(mu_);
    auto & slot = family(name, "histogram", help).histograms[format_labels(labels)];
    if (!slot) slot = std::make_unique<Histogram>(bounds);
    return *slot;
}

namespace {
// Adds `le` to an already formatted label set.
std::string with_le(const std::string & labels, const std::string & le) {
    if (labels.empty()) return "{le=\"" + le + "\"}";
    return labels.substr(0, labels.size() - 1) + ",le=\"" + le + "\"}";
}
}  // namespace

std::string Registry::render() const {
    std::lock_guard lk(mu_);
    std::ostringstream os;
    for (const auto & [name, f] : families_) {
        os << "# HELP " << name << ' ' << f.help << "\n# TYPE " << name << ' ' << f.type << '\n';
        for (const auto & [l, c] : f.counters)
            os << name << l << ' ' << c->value() << '\n';
        for (const auto & [l, g] : f.gauges)
            os << name << l << ' ' << fmt(g->value()) << '\n';
        for (const auto & [l, h] : f.histograms) {
            std::vector<uint64_t> b;
            double sum;
            uint64_t count;
            h->snapshot(b, sum, count);
            uint64_t cum = 0;
            for (size_t i = 0; i < h->bounds().size(); ++i) {
                cum += b[i];
                os << name << "_bucket" << with_le(l, fmt(h->bounds()[i])) << ' ' << cum << '\n';
            }
            os << name << "_bucket" << with_le(l, "+Inf") << ' ' << count << '\n';
            os << name << "_sum" << l << ' ' << fmt(sum) << '\n';
            os << name << "_count" << l << ' ' << count << '\n';
        }
    }
    return os.str();
}

}  // namespace armada::obs
