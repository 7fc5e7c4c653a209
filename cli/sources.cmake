add_executable(gcz_cli
  cli/cmd_bench.cpp
  cli/cmd_decode.cpp
  cli/cmd_encode.cpp
  cli/cmd_eval.cpp
  cli/cmd_info.cpp
  cli/cmd_verify.cpp
  cli/common.cpp
  cli/main.cpp
  cli/report.cpp)
set_target_properties(gcz_cli PROPERTIES OUTPUT_NAME gcz)
target_compile_options(gcz_cli PRIVATE -Wall -Wextra)
target_compile_definitions(gcz_cli PRIVATE GCZ_CLI_VERSION="${PROJECT_VERSION}")
target_link_libraries(gcz_cli PRIVATE gcz::gcz CLI11::CLI11 nlohmann_json::nlohmann_json)
