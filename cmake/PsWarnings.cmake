# ps_set_warnings(target): the project's warning set on one target.
function(ps_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local
      -Wnon-virtual-dtor -Wno-unused-parameter>)
  if(PS_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
