add_executable(gcz_cli cli/main.cpp)
set_target_properties(gcz_cli PROPERTIES OUTPUT_NAME gcz)
target_link_libraries(gcz_cli PRIVATE gcz::gcz CLI11::CLI11 nlohmann_json::nlohmann_json)
