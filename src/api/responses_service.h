#pragma once

#include "api/http_server.h"
#include "api/json_util.h"
#include "engine/chat_format.h"
#include "engine/engine.h"
#include "store/store.h"

#include <boost/asio/any_io_executor.hpp>

#include <memory>
#include <string>

namespace armada::api {

//! OpenAI's Responses API over the engine: `input` as text or items, `instructions`,
//! `previous_response_id` (the conversation is kept server-side, and the engine's prefix match
//! reuses its KV while resident), function tools executed by the client, streaming events with
//! `sequence_number`, and stored responses that belong to the API key that made them.
//! Stored responses are written to the checkpoint store, so they survive a restart.
class ResponsesService {
  public:
    ResponsesService(std::shared_ptr<engine::Model> model, engine::Engine & engine, store::Store & store,
                     boost::asio::any_io_executor io);
    ~ResponsesService();

    void create(const json & body, const std::string & owner, std::shared_ptr<Responder> out);
    void get(const std::string & id, const std::string & owner, const std::shared_ptr<Responder> & out);
    void erase(const std::string & id, const std::string & owner, const std::shared_ptr<Responder> & out);

  private:
    struct Run;
    engine::Model & model() { return *model_; }

    std::shared_ptr<engine::Model> model_;
    engine::Engine & engine_;
    store::Store & store_;
    boost::asio::any_io_executor io_;
    engine::ChatFormat format_;
};

}  // namespace armada::api
