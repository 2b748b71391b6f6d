#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace armada::engine {

//! Turns token pieces into client-visible text. It holds back bytes that may still become a
//! stop string or complete a UTF-8 character, so nothing emitted is ever taken back.
class TextStream {
  public:
    explicit TextStream(std::vector<std::string> stops = {});

    //! Adds a piece; returns the text now safe to emit. After a stop string matched, `stopped()`
    //! is true and the stop string and anything after it are dropped.
    std::string push(std::string_view piece);
    //! Flushes what is held back at the end of generation (invalid tail bytes become U+FFFD).
    std::string finish();
    bool stopped() const { return stopped_; }

  private:
    size_t holdback() const;

    std::vector<std::string> stops_;
    std::string pending_;
    bool stopped_ = false;
};

}  // namespace armada::engine
